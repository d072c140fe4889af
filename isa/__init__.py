"""The dynfuse ISA, defined once as data: fields, instruction table, encoding.

Everything that knows about instructions (assembler, simulator, RTL header,
docs, fusion codegen) derives it from here.
"""

from isa.encoding import Instruction, decode, encode, make
from isa.enums import Activation, Counter, DType, EpilogueFlags, Extension, Unit
from isa.errors import DynfuseError, EncodingError, IsaTableError
from isa.fields import FIELDS, WORD_BYTES, Field, Kind
from isa.spec import InstructionSpec
from isa.table import BY_MNEMONIC, INSTRUCTIONS

__all__ = [
    "Activation",
    "BY_MNEMONIC",
    "Counter",
    "DType",
    "DynfuseError",
    "EncodingError",
    "EpilogueFlags",
    "Extension",
    "FIELDS",
    "Field",
    "INSTRUCTIONS",
    "Instruction",
    "InstructionSpec",
    "IsaTableError",
    "Kind",
    "Unit",
    "WORD_BYTES",
    "decode",
    "encode",
    "make",
]
