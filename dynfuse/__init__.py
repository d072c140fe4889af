"""dynfuse: the command-line front door. The work lives in isa/, assembler/, simulator/, rtl/, fusion/."""
