"""Assembler: Lark-parsed text or Python instruction objects -> ObjectFile -> versioned binary."""
