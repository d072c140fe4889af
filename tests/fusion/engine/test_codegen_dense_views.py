"""`gemm.is_dense`: which DRAM views a kernel may load as one row-major block.

A size-1 axis is never stepped over, so its stride (0 when numpy broadcasting made it, e.g. a residual [1, T, D]
read against [B=1, T, D]) must not make a contiguous block look strided; any other stride mismatch must.
"""

from hypothesis import given
from hypothesis import strategies as st

from fusion.engine.codegen.gemm import is_dense
from fusion.lower.views import View, dense
from isa.enums import DType

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@given(shapes, st.integers(0, 1 << 12), st.data())
def test_any_stride_on_a_size1_axis_keeps_a_row_major_view_dense(shape, address, data):
    view = dense(address, shape, DType.f32)
    pairs = zip(shape, view.strides, strict=True)
    strides = tuple(data.draw(st.sampled_from((0, s, 7 * s))) if n == 1 else s for n, s in pairs)
    assert is_dense(View(address, shape, strides, DType.f32))


@given(shapes, st.data())
def test_a_strided_or_broadcast_axis_longer_than_one_is_not_dense(shape, data):
    axes = [i for i, n in enumerate(shape) if n > 1]
    if not axes:
        return
    view = dense(0, shape, DType.i8)
    axis = data.draw(st.sampled_from(axes))
    stride = data.draw(st.sampled_from((0, 2 * view.strides[axis] + 1)))
    strides = view.strides[:axis] + (stride,) + view.strides[axis + 1 :]
    assert not is_dense(View(0, shape, strides, DType.i8))


def test_the_broadcast_residual_of_a_layout_chain_is_dense():
    """The view ViT's and Whisper's positional/residual Add hands a layout chain (found by bench_tvm)."""
    assert is_dense(View(0, (1, 17, 64), (0, 256, 4), DType.f32))
