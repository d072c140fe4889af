"""A conv's matrix work as hardware loops: the per-tap, per-channel-block preload + matmul items whose addresses
step by the same amounts are one `loopi` body with `addi`-stepped address registers instead of unrolled text.

A conv kernel's text is mostly these items (every tap x channel block x row run, each with the `li`s of its
addresses), and text length is what every build stage costs (generation, assembly, encoding, hashing). A loop
issues the same matrix instructions in the same order; its `addi`s take the issue slots the unrolled `li`s took.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import sub

from fusion.lower.emitter import Emitter

# (builder method, register operand values, the other operands): one instruction of an item
Op = tuple[str, tuple[int, ...], tuple]
Item = tuple[Op, ...]
# An item as what the items of one run share, per op (builder method, register operand count, the other operands),
# and its register operand values in op order: a generator making many items makes them so (`emit_keyed`), each
# shape once, not an op tuple and a value tuple per instruction taken apart again here
Shape = tuple[tuple[str, int, tuple], ...]
Keyed = tuple[Shape, tuple[int, ...]]
MIN_LOOP = 3  # fewer items are emitted unrolled (a loop's setup costs about as much text as it saves)
MAX_TRIPS = 0xFFFF  # `loopi`'s count field
MAX_REGS = 24  # registers a loop may hold (the emitter's 31, less room for the values it keeps cached)


def emit_items(em: Emitter, items: Sequence[Item]) -> None:
    """Emit `items` in order: each maximal run of items of the same instructions whose operand values step by
    the same amounts from one item to the next as a hardware loop, the rest unrolled."""
    emit_keyed(em, [_keyed(item) for item in items])


def emit_keyed(em: Emitter, items: Sequence[Keyed]) -> None:
    """`emit_items` of items given as (shape, values) (`Keyed`)."""
    # links[i]: how item i + 1's values step from item i's; None where the two differ in shape
    links = [tuple(map(sub, b, a)) if sb == sa else None for (sa, a), (sb, b) in zip(items, items[1:], strict=False)]
    i = 0
    while i < len(items):
        j = _run_end(links, i)
        step = links[i] if j > i + 1 else ()
        _emit_run(em, *items[i], step, j - i)
        i = j


def emit_run(em: Emitter, item: Item, step: tuple[int, ...], count: int) -> None:
    """`count` items: `item`, then each with its register operand values (in order) stepped by `step` from the
    one before, as a hardware loop when it is worth one (a generator that knows its run asks this directly,
    without building every item)."""
    _emit_run(em, *_keyed(item), step, count)


def _emit_run(em: Emitter, shape: Shape, values: tuple[int, ...], step: tuple[int, ...], count: int) -> None:
    if not (count >= MIN_LOOP and _loop(em, shape, values, step, count)):
        _unrolled(em, shape, values, step, count)


def _unrolled(em: Emitter, shape: Shape, values: tuple[int, ...], step: tuple[int, ...], count: int) -> None:
    emitter, regs = em.emitter, em.regs
    for i in range(count):
        vals = tuple(v + i * d for v, d in zip(values, step, strict=True)) if i else values
        k = 0
        for name, n, rest in shape:
            emitter(name)(*regs(*vals[k : k + n]), *rest)
            k += n


def steps(first: Item, second: Item) -> tuple[int, ...]:
    """How far each register operand value of `second` is from `first`'s (the step of a run they begin)."""
    a, b = _keyed(first)[1], _keyed(second)[1]
    if len(a) != len(b):
        raise ValueError(f"items of {len(a)} and {len(b)} register operands do not step")
    return tuple(map(sub, b, a))


def _keyed(item: Item) -> Keyed:
    """The item as (shape, values) (`Keyed`), in one pass."""
    shape, values = [], ()
    for name, vals, rest in item:
        shape.append((name, len(vals), rest))
        values += vals
    return tuple(shape), values


def _run_end(links: list[tuple[int, ...] | None], i: int) -> int:
    """The end of the longest run from item i whose items are of one shape and whose operand values step by
    constant amounts (`links`, `emit_items`), at most MAX_TRIPS items."""
    step = links[i] if i < len(links) else None
    j = i + 1
    if step is None:
        return j
    end = min(len(links) + 1, i + MAX_TRIPS)
    while j + 1 < end and links[j] == step:
        j += 1
    return j + 1


def _loop(em: Emitter, shape: Shape, values: tuple[int, ...], step: tuple[int, ...], count: int) -> bool:
    """The run (`values`: its first item's register operand values): its first item unrolled, the values that step
    in registers of its own (`Emitter.claim`), then one `loopi` over the others, each stepping a register (`addi`)
    just before its first use: the matrix unit's first instruction issues as early as unrolled, and the loop costs
    one issue slot more (its `loopi`). False, nothing emitted: the run needs more registers than a loop may hold."""
    keys = list(zip(values, step, strict=True))  # (value, step): one register each
    if len(keys) > MAX_REGS and len(set(keys)) > MAX_REGS:
        return False
    claim, held, emitter = em.claim, em.reg, em.emitter
    regs: dict[tuple[int, int], int] = {}
    reg = regs.__getitem__  # (operands by `map`: no comprehension frame per instruction)
    ops, k = [], 0
    for name, n, rest in shape:
        used = keys[k : k + n]
        k += n
        for key in used:  # the op's stepping values claimed in order, then its fixed ones looked up
            if key[1] and key not in regs:
                regs[key] = claim(key[0])
        for key in used:  # (one `reg` each: the cache's steps of one `regs` call over them)
            if not key[1]:
                regs[key] = held(key[0])
        method = emitter(name)
        method(*map(reg, used), *rest)
        ops.append((method, used, rest))
    end = em.local_label("taps")
    emitter("loopi")(count - 1, end)
    addi, stepped = emitter("addi"), set()
    for method, used, rest in ops:
        for key in used:
            if key[1] and key not in stepped:
                stepped.add(key)
                r = regs[key]
                addi(r, r, key[1])
        method(*map(reg, used), *rest)
    em.b.label(end)
    return True
