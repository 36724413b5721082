"""Registry completeness: every op in `torch.ops.tfgrads` is complete in every layer.

For each op: a public function (or a declared reason it is internal), a fake kernel, an autograd
formula (or a declared reason it has none), a CPU kernel, a CUDA kernel in csrc/cuda/ (which
setup.py compiles whenever it builds CUDA), a section in docs/ops/<family>.md, an opcheck sample
in the family's test module and a benchmark row. Adding an op half-way fails here.
"""

import ast
import importlib
import pathlib
import re

import pytest
import torch

import torch_tfgrads

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Ops users do not call: the adjoints that give the pool gradients their own gradients.
INTERNAL = {
    "_fractional_avg_pool_grad_backward": "double backward of fractional_avg_pool_grad",
    "_fractional_max_pool_grad_backward": "double backward of fractional_max_pool_grad",
}
NO_AUTOGRAD = {
    "fused_batch_norm_sync_grad_sums": "backward half of synchronized batch norm, whose double "
    "backward is refused with NotImplementedError (distributed/sync_batch_norm.py)",
    "fused_batch_norm_sync_backprop_input": "backward half of synchronized batch norm, whose "
    "double backward is refused with NotImplementedError (distributed/sync_batch_norm.py)",
    "fractional_pooling_sequence": "returns integer cell boundaries: nothing to differentiate",
}
NO_BENCHMARK = {
    "fractional_pooling_sequence": "O(H + W) host work, also done inside every forward row",
    "_fractional_avg_pool_grad_backward": "internal; runs only in double backward",
    "_fractional_max_pool_grad_backward": "internal; runs only in double backward",
}
# Ops with one device-independent kernel (host-side sequences) need no CUDA kernel.
FAMILY_TESTS = (
    "test_fused_batch_norm",
    "test_fractional_pool",
    "test_depthwise_conv2d",
    "test_cudnn_rnn",
)


def all_ops():
    return sorted(
        n.split("::", 1)[1]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("tfgrads::")
    )


OPS = all_ops()


def _qualname(op):
    return f"tfgrads::{op}"


def _has_kernel(op, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(_qualname(op), key)


# Each family's modules under torch_tfgrads/ops/ (the first one names the family and its doc).
FAMILY_MODULES = {
    "fused_batch_norm": ("fused_batch_norm",),
    "fractional_pool": ("fractional_pool",),
    "depthwise_conv2d": ("depthwise_conv2d",),
    "cudnn_rnn": ("cudnn_rnn", "cudnn_rnn_params"),
}


def _family(op):
    """The family whose module (torch_tfgrads.ops.<module>) registered the op's fake."""
    entry = torch._library.simple_registry.singleton.find(_qualname(op))
    kernel = entry.fake_impl.kernel
    assert kernel is not None, f"{op}: no fake kernel"
    func = getattr(kernel, "func", kernel)
    module = (getattr(func, "__module__", "") or "").removeprefix("torch_tfgrads.ops.")
    for family, modules in FAMILY_MODULES.items():
        if module in modules:
            return family
    for family, modules in FAMILY_MODULES.items():  # wrapped: find it in the modules' sources
        for name in modules:
            if f'"tfgrads::{op}"' in (ROOT / "torch_tfgrads" / "ops" / f"{name}.py").read_text():
                return family
    return module


def test_the_registry_is_not_empty():
    assert len(OPS) >= 15, OPS


@pytest.mark.parametrize("op", OPS)
def test_public_function(op):
    if op in INTERNAL:
        assert op.startswith("_") and not hasattr(torch_tfgrads, op)
        return
    fn = getattr(torch_tfgrads, op, None)
    assert callable(fn), f"torch_tfgrads.{op} is missing"
    assert op in torch_tfgrads.__all__
    assert fn.__doc__ and fn.__annotations__, f"torch_tfgrads.{op} needs a docstring and hints"


@pytest.mark.parametrize("op", OPS)
def test_fake_kernel(op):
    entry = torch._library.simple_registry.singleton.find(_qualname(op))
    assert entry.fake_impl.kernel is not None, f"{op}: no fake kernel (register_fake)"
    assert _family(op) in FAMILY_MODULES


@pytest.mark.parametrize("op", OPS)
def test_autograd(op):
    has = _has_kernel(op, "Autograd") or _has_kernel(op, "AutogradCPU")
    if op in NO_AUTOGRAD:
        assert not has, f"{op} has an autograd formula: drop it from NO_AUTOGRAD"
        return
    assert has, f"{op}: no autograd formula (register_autograd) and no declared reason"


@pytest.mark.parametrize("op", OPS)
def test_cpu_kernel(op):
    assert _has_kernel(op, "CPU") or _has_kernel(op, "CompositeExplicitAutograd"), op


def _cuda_impls():
    """Op names registered in TORCH_LIBRARY_IMPL(tfgrads, CUDA, m) blocks of csrc/cuda/*.cu."""
    names = set()
    for path in (ROOT / "csrc" / "cuda").glob("*.cu"):
        src = path.read_text()
        for block in re.findall(
            r"TORCH_LIBRARY_IMPL\(tfgrads,\s*CUDA,\s*m\)\s*\{(.*?)\n\}", src, re.S
        ):
            names.update(re.findall(r'm\.impl\("([A-Za-z0-9_]+)"', block))
    return names


@pytest.mark.parametrize("op", OPS)
def test_cuda_kernel(op):
    if _has_kernel(op, "CompositeExplicitAutograd"):
        return  # one kernel for every device
    assert op in _cuda_impls(), f"{op}: no CUDA kernel in csrc/cuda/*.cu"
    assert (
        'csrc", "cuda", "*.cu"' in (ROOT / "setup.py").read_text()
        or "csrc/cuda" in (ROOT / "setup.py").read_text()
    )


@pytest.mark.parametrize("op", OPS)
def test_doc_section(op):
    doc = ROOT / "docs" / "ops" / f"{_family(op)}.md"
    assert doc.is_file(), f"{doc} is missing"
    headings = [line for line in doc.read_text().splitlines() if line.startswith("#")]
    word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(op)}(?![A-Za-z0-9_])")
    assert any(word.search(h) for h in headings), (
        f"{op}: no heading naming {op} in {doc.relative_to(ROOT)}"
    )


def _opchecked_ops():
    names = set()
    for module in FAMILY_TESTS:
        mod = importlib.import_module(module)
        names.update(name for name, _args, _kwargs in mod.opcheck_samples())
    return names


@pytest.fixture(scope="module")
def opchecked():
    return _opchecked_ops()


@pytest.mark.parametrize("op", OPS)
def test_opcheck_sample(op, opchecked):
    assert op in opchecked, f"{op}: no opcheck sample in the family's opcheck_samples()"


def _benchmarked_ops():
    names = set()
    for path in (ROOT / "benchmarks").glob("bench_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "TIMED_OPS" for t in node.targets
            ):
                names.update(ast.literal_eval(node.value))
    return names


@pytest.mark.parametrize("op", OPS)
def test_benchmark_row(op):
    if op in NO_BENCHMARK:
        assert op not in _benchmarked_ops()
        return
    assert op in _benchmarked_ops(), f"{op}: no benchmark lists it in TIMED_OPS"


def test_declared_exceptions_name_real_ops():
    for table in (INTERNAL, NO_AUTOGRAD, NO_BENCHMARK):
        assert set(table) <= set(OPS), set(table) - set(OPS)


# Ops that draw host-side randomness (seeds 0, dropout) cannot be replayed from a CUDA graph:
# the tag makes Inductor partition around them.
CUDAGRAPH_UNSAFE = {"fractional_avg_pool", "fractional_max_pool", "cudnn_rnn_v3"}


@pytest.mark.parametrize("op", OPS)
def test_cudagraph_unsafe_tag(op):
    tags = getattr(torch.ops.tfgrads, op).default.tags
    assert (torch.Tag.cudagraph_unsafe in tags) == (op in CUDAGRAPH_UNSAFE), (op, tags)


def _setup_function(name):
    """A top-level function of setup.py, without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns = {}
    exec(compile(ast.Module([node], []), "setup.py", "exec"), ns)  # noqa: S102 - our own file
    return ns[name]


@pytest.mark.parametrize(
    "arch_list,expected",
    [
        ("9.0", "9.0+PTX"),
        ("8.0;9.0", "8.0;9.0+PTX"),
        ("9.0 8.6", "9.0+PTX;8.6"),
        ("12.0,9.0", "12.0+PTX;9.0"),
        ("8.0;9.0+PTX", "8.0;9.0+PTX"),  # already there: unchanged
    ],
)
def test_cuda_builds_embed_ptx_for_the_newest_arch(arch_list, expected):
    assert _setup_function("with_ptx")(arch_list) == expected
