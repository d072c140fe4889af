"""The local (on-chip) address map, part of the ISA contract.

Vector and DMA instructions take one local address: below LOCAL_ACC_BASE it is
a scratchpad byte address, from LOCAL_ACC_BASE up an accumulator byte address
(4-byte int32/fp32 entries). DRAM is a separate byte-addressed space reached
only by DMA, `lw`/`sw` and `dispatch`.
"""

LOCAL_ACC_BASE = 1 << 24
ACC_ELEMENT_BYTES = 4
