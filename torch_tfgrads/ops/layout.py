"""The physical-layout choice of csrc/common/channel_layout.h, for fake tensors.

Kernels compute on whichever dense order the input already has (channels-last or
channels-first) and allocate outputs in that order; fakes must report the same strides.
"""


def channel_layout_perm(x, cdim, natural_channels_last):
    dim = x.dim()
    last = [d for d in range(dim) if d != cdim] + [cdim]
    first = [0, cdim] + [d for d in range(1, dim) if d != cdim]
    last_dense = x.permute(last).is_contiguous()
    first_dense = x.permute(first).is_contiguous()
    # A tensor dense in both orders (e.g. H = W = 1) takes the format's natural order.
    use_last = (
        (last_dense or not first_dense)
        if natural_channels_last
        else (last_dense and not first_dense)
    )
    return last if use_last else first


def empty_in_layout(like, shape, perm, dtype=None):
    phys = [shape[p] for p in perm]
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return like.new_empty(phys, dtype=dtype or like.dtype).permute(inv)
