"""int8 query graphs that hold on every CPU: which ONNX Runtime kernel this host's int8 MatMuls take, the weight
format that does not saturate there, and the check that refuses an int8 graph whose queries drift from fp32.

Why the weight format depends on the host: dynamic quantization feeds uint8 activations to MatMulInteger. With
int8 weights (U8S8) ONNX Runtime's x86 kernels multiply with VPMADDUBSW on AVX2 hosts without VNNI, which adds two
uint8 x int8 products into a saturating int16; a text tower's outlier activations overflow it and the query vector
bends (a random SigLIP: cosine 0.95 to fp32 on an AVX2-only host, 0.9999 on an AVX-512 VNNI one). VNNI's VPDPBUSD
and ARM's dot-product kernels accumulate in int32 and never saturate, and U8U8 kernels widen to int16 before
multiplying, so: int8 weights where the kernel cannot saturate (the faster format there), uint8 weights elsewhere.
Measured per kernel path, with an emulated AVX2 host: docs/research/int8_kernels.md.

Whatever the format, `check` encodes fixed probe queries both ways when an int8 graph is first loaded and refuses
it below the stated cosine (RuntimeOptions.int8_min_cosine, CROSSPROBE_INT8_MIN_COSINE), naming the kernel path
and the cosine it measured: a host never serves int8 queries below the cosine the docs state.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MIN_COSINE = 0.999  # the stated cosine of an int8 query to its fp32 one (docs/models.md)
# probe queries for `check`: short and long, several scripts and languages, as users type them
PROBES = (
    "a dog runs on the beach",
    "一只狗在海滩上奔跑",
    "two people ride bikes down a long road in the rain",
    "Pies biegnie po plaży",
    "a red car",
    "eine Frau liest ein Buch im Park",
    "sunset",
    "a man in a blue shirt plays the guitar on a stage at night while the crowd watches",
)
# kernel paths whose int8 x uint8 products accumulate in int32 (no saturation): int8 weights are exact there
# (AVX-VNNI is the VEX form of the same VPDPBUSD; ARM's SDOT/UDOT accumulate in int32 too). Plain arm64 and the
# AVX2-only paths take uint8 weights.
NO_SATURATION = ("x86 AVX-512 VNNI", "x86 AVX-VNNI", "arm64 dot-product")


class Int8Refused(RuntimeError):
    """An int8 query graph drifts from fp32 on this host beyond the stated cosine."""


@dataclass(frozen=True)
class Int8Check:
    """What `check` measured: the kernel path, the weight format, the lowest probe cosine and the bar it met."""

    kernel: str
    weights: str  # "s8" | "u8"
    min_cosine: float
    required: float

    def as_dict(self) -> dict:
        return {
            "kernel": self.kernel,
            "weights": self.weights,
            "min_cosine": round(self.min_cosine, 6),
            "required": self.required,
        }


def kernel_path() -> str:
    """The int8 MatMul kernel family ONNX Runtime's CPU provider dispatches to here, from the CPU's own feature
    bits (numpy reads CPUID at import, so an emulated CPU reports its emulated features)."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return "arm64 dot-product" if _cpu_features().get("ASIMDDP") else "arm64"
    f = _cpu_features()
    if f.get("AVX512VNNI") or f.get("AVX512_CLX"):
        return "x86 AVX-512 VNNI"
    if f.get("AVX2") and _linux_flag("avx_vnni") and not _disagrees_with_cpuinfo(f):
        return "x86 AVX-VNNI"  # numpy has no bit for AVX-VNNI (VEX-encoded VNNI without AVX-512)
    if f.get("AVX512BW"):
        return "x86 AVX-512 (no VNNI)"
    if f.get("AVX2"):
        return "x86 AVX2 (no VNNI)"
    return f"{machine} (no AVX2)"


def weight_format(kernel: str | None = None) -> str:
    """ "s8" (int8 weights, U8S8) where the kernel accumulates without saturating, else "u8" (U8U8)."""
    return "s8" if (kernel or kernel_path()) in NO_SATURATION else "u8"


def graph_name(fp32: Path, weights: str) -> Path:
    """Where the int8 graph of `fp32` lives beside it: <stem>.int8 (int8 weights, the name every earlier version
    wrote) or <stem>.int8-u8 (uint8 weights). Both may sit in one shared folder that hosts of each kind read."""
    return fp32.with_name(fp32.stem + (".int8" if weights == "s8" else ".int8-u8") + fp32.suffix)


def quantize(src: Path, dst: Path, weights: str, exclude: Sequence[str] = (), external_data: bool = False) -> None:
    """Dynamic quantization of `src`'s MatMul weights into `dst` (one scale per output channel: per-tensor scales
    cost accuracy, docs/research/query_tower_quant.md); activations are quantized per run."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src),
        str(dst),
        weight_type=QuantType.QInt8 if weights == "s8" else QuantType.QUInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=list(exclude),
        use_external_data_format=external_data,
    )


def check(
    encode_fp32: Callable[[list[str]], np.ndarray],
    encode_int8: Callable[[str], np.ndarray],
    required: float,
    weights: str,
    what: str,
) -> Int8Check:
    """Each probe encoded by both graphs (int8 one query per run, as it serves); Int8Refused below `required`."""
    fp = _unit(encode_fp32(list(PROBES)))
    q8 = _unit(np.stack([np.asarray(encode_int8(t)).reshape(-1) for t in PROBES]))
    low = float(np.min(np.sum(fp * q8, axis=1)))
    result = Int8Check(kernel_path(), weights, low, required)
    if low < required:
        raise Int8Refused(
            f"int8 queries refused for {what} on this host: their cosine to fp32 is {low:.4f} on the probe queries, "
            f"below the stated {required} (ONNX Runtime's {result.kernel} kernels, {weights} weights). Serve fp32 "
            f"(CROSSPROBE_QUERY_PRECISION=fp32), or accept a lower cosine with CROSSPROBE_INT8_MIN_COSINE"
        )
    return result


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(len(PROBES), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _cpu_features() -> dict[str, bool]:
    import importlib

    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        umath = importlib.import_module("numpy.core._multiarray_umath")
    return dict(umath.__cpu_features__)


def _linux_flag(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def _disagrees_with_cpuinfo(f: dict[str, bool]) -> bool:
    """/proc/cpuinfo describes another CPU than CPUID does (a CPU emulator): trust CPUID alone."""
    return _linux_flag("avx512f") != bool(f.get("AVX512F"))
