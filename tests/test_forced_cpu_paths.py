"""Every CPU ISA path keeps TensorFlow's numbers, on any host: TensorFlow parity tests rerun in a
child process with a path forced (torch_tfgrads.cpu: TFGRADS_CPU_CAPABILITY=avx2 turns our
AVX-512 kernels off, TFGRADS_DISABLE_BRGEMM=1 makes the RNN use its per-step cells and ATen's
GEMMs), and the forcing variables themselves: the paths they report and their errors.

Where the forced path is the host's own (e.g. avx2 on a CPU without AVX-512) the parent's run of
the same tests already covers it; the child runs anyway, so the check never depends on the host.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_tfgrads as T
from helpers import REQUIRE_TF

TESTS = Path(__file__).resolve().parent

# (forcing variables, the TF parity tests of the kernels that have another path there)
FORCED = {
    "avx2": (
        {"TFGRADS_CPU_CAPABILITY": "avx2"},
        [
            "test_depthwise_conv2d_tf.py::test_matches_tensorflow",
            "test_fractional_pool_tf.py::test_bit_exact_with_tensorflow",
            "test_fractional_pool_tf.py::test_grads_negative_zero_like_tensorflow",
            "test_fractional_pool.py::test_max_grad_bands_of_few_images_equal_whole_images",
            # the RNN's batched GEMMs go through ATen without our AVX-512 kernels
            "test_cudnn_rnn_tf.py::test_matches_keras",
            "test_cudnn_rnn.py::test_fused_steps_split_rows_or_blocks",
            "test_cudnn_rnn.py::test_fused_steps_with_few_and_many_rows_per_thread",
            # the tiled steps' float32 tile at AVX2's width
            "test_cudnn_rnn.py::test_tiled_steps_match_oracle",
        ],
    ),
    # the 8-lane depthwise kernels on layers whose pixels alias in L1, both ways on any host
    **{
        f"avx2-{how}": (
            {"TFGRADS_CPU_CAPABILITY": "avx2", "TFGRADS_DEPTHWISE_ALIASING": how},
            [
                "test_depthwise_conv2d_tf.py::test_matches_tensorflow",
                "test_depthwise_conv2d.py::test_filter_gradient_by_pixel_equals_the_tiles_bit_for_bit",
                "test_depthwise_conv2d.py::test_correlation_by_pixel_equals_the_tiles_bit_for_bit",
            ],
        )
        for how in ("by_pixel", "tiles")
    },
    "no-brgemm": (
        {"TFGRADS_DISABLE_BRGEMM": "1"},
        ["test_cudnn_rnn_tf.py::test_matches_keras", "test_cudnn_rnn.py"],
    ),
}


def _child(env_overrides, code_or_args, timeout=900):
    env = dict(os.environ, **env_overrides)
    if REQUIRE_TF:
        env["TFGRADS_REQUIRE_TF"] = "1"
    return subprocess.run(
        [sys.executable, *code_or_args],
        env=env,
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _paths(env_overrides):
    out = _child(
        env_overrides, ["-c", "import torch_tfgrads as T; print(T.cpu.cpu_paths())"], timeout=120
    )
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own dict literal


@pytest.mark.needs_tf
@pytest.mark.parametrize("path", list(FORCED))
def test_tensorflow_parity_holds_on_the_forced_path(tf, path):
    env, tests = FORCED[path]
    paths = _paths(env)
    if path.startswith("avx2"):
        assert paths["avx512_kernels"] is False, paths
        assert paths["rnn_batched_gemms"] == "aten", paths
        up_to = 3 << 20 if paths["rnn_brgemm"] else 0
        assert paths["rnn_tiles_before_brgemm_up_to_bytes"] == up_to, paths
        if path != "avx2":
            assert paths["depthwise_aliasing"] == path.removeprefix("avx2-"), paths
    else:
        assert paths["rnn_brgemm"] is False, paths
        assert paths["rnn_tiles_before_brgemm_up_to_bytes"] == 0, paths
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not needs_cuda"]
    args += [f"tests/{t}" for t in tests]
    out = _child(env, args)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert out.returncode == 0, f"{path}: {summary}\n{out.stdout[-4000:]}"
    assert " passed" in summary and "skipped" not in summary, summary


def test_cpu_paths_report_the_host():
    p = T.cpu.cpu_paths()
    assert {"cpu", "aten_capability", "avx512_kernels", "rnn_brgemm", "forced"} <= set(p)
    assert isinstance(p["avx512_kernels"], bool) and isinstance(p["rnn_brgemm"], bool)
    if p["aten_capability"] != "AVX512":
        assert p["avx512_kernels"] is False
    # the RNN's batched GEMMs are on BRGEMM exactly where BRGEMM runs with our AVX-512 kernels
    on_brgemm = p["rnn_brgemm"] and p["avx512_kernels"]
    assert p["rnn_batched_gemms"] == ("brgemm" if on_brgemm else "aten"), p
    # a bidirectional layer's directions take turns when wide, on BRGEMM's steps and the tiles
    assert p["rnn_directions_in_turn_above_bytes"] == 3 << 20, p
    # unforced: the tiles from 8 columns on a CPU with AVX-512 (cpu/isa.h), which our AVX-512
    # kernels imply (with them off the CPU may still have it), pixel by pixel without
    forced = os.environ.get("TFGRADS_DEPTHWISE_ALIASING")
    if forced:
        assert p["depthwise_aliasing"] == forced, p
    elif p["avx512_kernels"]:
        assert p["depthwise_aliasing"] == "tiles_from_8_columns", p
    else:
        assert p["depthwise_aliasing"] in ("by_pixel", "tiles_from_8_columns"), p
    assert p["rnn_tiled_steps_min_rows_per_thread"] == 8, p
    # shared narrow directions go to the tiles before BRGEMM on the 8-lane path only
    tiles_first = p["rnn_brgemm"] and not p["avx512_kernels"]
    assert p["rnn_tiles_before_brgemm_up_to_bytes"] == (3 << 20 if tiles_first else 0), p
    assert p["streaming_stores"] is (os.environ.get("TFGRADS_DISABLE_STREAMING", "0") in ("", "0"))
    assert p["l3_bytes"] is None or p["l3_bytes"] > 0, p
    # the kernels plan with the OS's L3 size, 32 MiB where it reports none, unless forced
    forced_l3 = os.environ.get("TFGRADS_L3_BYTES")
    want_l3 = int(forced_l3) if forced_l3 else (p["l3_bytes"] or 32 << 20)
    assert p["kernel_l3_bytes"] == want_l3, p
    assert _paths({"TFGRADS_DISABLE_STREAMING": "1"})["streaming_stores"] is False
    assert T.cpu.describe().startswith(p["cpu"])


def test_l3_bytes_as_sysfs_reports():
    # The extension's reader (C stdio) against Python's own read of the same files: the level
    # found and the unit suffix (K, M, G) applied.
    want = None
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, size = (index / "level").read_text().strip(), (index / "size").read_text()
        except OSError:
            continue
        if level == "3":
            size = size.strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            want = int(size.rstrip("KMG")) * scale
            break
    assert T.cpu.l3_bytes() == want


def test_extension_uses_no_file_streams():
    # On the GPU machines' build the extension carried its own libstdc++, whose std::ifstream
    # segfaulted in operator>> (session 36): files are read with C stdio (cpu/isa.cpp).
    csrc = Path(__file__).resolve().parents[1] / "csrc"
    found = [
        f"{path.relative_to(csrc)}: {token}"
        for path in sorted(csrc.rglob("*"))
        if path.suffix in (".cpp", ".h", ".cu", ".cuh")
        for token in ("<fstream>", "<iostream>", "std::ifstream", "std::istream", "std::cin")
        if token in path.read_text()
    ]
    assert not found, found


def test_streaming_stores_change_no_result(tmp_path):
    # Every kernel that streams its large outputs (tests/streaming_outputs.py), with the
    # non-temporal stores and with TFGRADS_DISABLE_STREAMING=1's ordinary ones: bit for bit
    # the same, and each output past the size from which it streams.
    runs = {}
    for name, env in (("streaming", {}), ("ordinary", {"TFGRADS_DISABLE_STREAMING": "1"})):
        out = _child(env, ["tests/streaming_outputs.py", str(tmp_path / name)], timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = torch.load(tmp_path / name)
    assert runs["streaming"].pop("streaming") is True
    assert runs["ordinary"].pop("streaming") is False
    assert runs["streaming"].keys() == runs["ordinary"].keys()
    for key, a in runs["streaming"].items():
        threshold = (8 if key.startswith("bn_fwd") else 4) << 20
        assert a.numel() * a.element_size() > threshold, key
        assert torch.equal(a, runs["ordinary"][key]), key


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_source_ring_changes_no_result(tmp_path, isa):
    # Stride-2 (and 3) depthwise forwards and filter gradients whose source exceeds the L3 copy
    # its rows into a ring before the tiles read them: with the L3 taken as 1 MiB the child's
    # layers do; with 1 TiB none does (and layers whose pixels alias in L1 sweep 256 channels at
    # a time instead of 64). Bit for bit the same, on the native path and the 8-lane one, and
    # the planned size is the forced one.
    runs = {}
    for name, l3 in (("ring", 1 << 20), ("in_place", 1 << 40)):
        env = {"TFGRADS_L3_BYTES": str(l3)}
        if isa == "avx2":
            env["TFGRADS_CPU_CAPABILITY"] = "avx2"
        out = _child(env, ["tests/depthwise_source_ring.py", str(tmp_path / name)], timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = torch.load(tmp_path / name)
        assert runs[name].pop("kernel_l3_bytes") == l3
    assert runs["ring"].keys() == runs["in_place"].keys() and len(runs["ring"]) == 22
    for key, a in runs["ring"].items():
        assert torch.equal(a, runs["in_place"][key]), key


def test_forcing_variables_are_checked():
    bad = _child(
        {"TFGRADS_CPU_CAPABILITY": "sse"}, ["-c", "import torch_tfgrads as T; T.cpu.cpu_paths()"]
    )
    assert bad.returncode != 0
    assert "TFGRADS_CPU_CAPABILITY must be avx2, avx512 or unset, got 'sse'" in bad.stderr
    bad = _child(
        {"TFGRADS_DEPTHWISE_ALIASING": "rows"},
        ["-c", "import torch_tfgrads as T; T.cpu.cpu_paths()"],
    )
    assert bad.returncode != 0
    assert "TFGRADS_DEPTHWISE_ALIASING must be by_pixel, tiles or unset, got 'rows'" in bad.stderr
    bad = _child(
        {"TFGRADS_L3_BYTES": "32MiB"}, ["-c", "import torch_tfgrads as T; T.cpu.cpu_paths()"]
    )
    assert bad.returncode != 0
    assert "TFGRADS_L3_BYTES must be a positive byte count, got '32MiB'" in bad.stderr
    forced = _paths({"TFGRADS_CPU_CAPABILITY": "avx2", "TFGRADS_DISABLE_BRGEMM": "1"})
    assert forced["forced"] == {"TFGRADS_CPU_CAPABILITY": "avx2", "TFGRADS_DISABLE_BRGEMM": "1"}
    # avx512 where the host (or ATen) has none is an error, not a silent fallback
    if not T.cpu.cpu_paths()["avx512_kernels"]:
        out = _child(
            {"TFGRADS_CPU_CAPABILITY": "avx512"},
            ["-c", "import torch_tfgrads as T; T.cpu.cpu_paths()"],
        )
        assert out.returncode != 0 and "TFGRADS_CPU_CAPABILITY=avx512, but" in out.stderr
