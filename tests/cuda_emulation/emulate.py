"""kernels/cuda/long_pairs.cu, search_s16.cu and search_soft.cu, their headers and their host launchers, built
for the CPU against the emulation in cuda_runtime.h beside this file, and called through ctypes: the CUDA
source itself, run where there is no GPU.

The copy is rewritten only where a host compiler cannot take CUDA: the PTX of common.cuh, sources.cuh and
the search kernels becomes emu:: calls, the kernel launches `kernel<<<grid, block, shared, stream>>>(args)` become
`emu::launch(grid, block, shared, [&] { kernel(args); })`, and the dynamic shared memory a pointer into the
emulated block's. Everything else compiles as written.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent.parent / "kernels" / "cuda"

PTX = {
    'asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));': "r = emu::max_nan(a, b);",
    'asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));': "r = emu::min_nan(a, b);",
    'asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));': "r = emu::ex2(x);",
    'asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));': "r = emu::lg2(x);",
    'asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v[r]) : "r"(offs[r] + row[d]));': "v[r] = 0.0f;",
    'asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(address));': "v = emu::load_shared_u32(address);",
    'asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(address));': "v = emu::load_shared_f32(address);",
    "extern __shared__ float smem[];": "float* const smem = emu::dynamic_shared<float>();",
    "extern __shared__ float4 kept_shared[];": "float4* const kept_shared = emu::dynamic_shared<float4>();",
    "extern __shared__ unsigned shared_table[];": "unsigned* const shared_table = emu::dynamic_shared<unsigned>();",
}


def split_top_level(text: str) -> list[str]:
    """text split at the commas outside any brackets."""
    parts, depth, current = [], 0, ""
    for c in text:
        depth += (c in "(<[") - (c in ")>]")
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    return [p.strip() for p in parts + [current]]


def rewrite_launches(source: str) -> str:
    """Every `callee<<<config>>>(args);` as an emu::launch of a lambda that calls callee(args)."""
    out, pos = [], 0
    while (start := source.find("<<<", pos)) >= 0:
        i, depth = start - 1, 0  # back over the callee, template arguments included
        while i >= 0 and (depth > 0 or source[i].isalnum() or source[i] in "_:<>"):
            depth += (source[i] == ">") - (source[i] == "<")
            i -= 1
        end = source.index(">>>", start)
        config = split_top_level(source[start + 3:end])
        j, depth = end + 3, 0  # the call's closing parenthesis
        while True:
            depth += (source[j] == "(") - (source[j] == ")")
            if depth == 0:
                break
            j += 1
        shared = config[2] if len(config) > 2 else "0"
        out.append(source[pos:i + 1])
        out.append(f"emu::launch(dim3({config[0]}), dim3({config[1]}), size_t({shared}), "
                   f"[&] {{ {source[i + 1:start]}({source[end + 4:j]}); }})")
        pos = j + 1
    return "".join(out) + source[pos:]


def build(folder: Path, kernel: str = "long_pairs.cu", driver: str = "driver.cpp",
          changes: dict[str, str] | None = None) -> Path:
    """The emulated kernel file (kernels/cuda/<kernel>) with its C entry points (<driver> beside this file) as a
    shared library in folder. changes: text of the kernel file to replace (each must occur in it), such as
    a constant that sets its warps a block (the emulation runs a block's warps together, its blocks one
    after another)."""
    copy = folder / "src"
    copy.mkdir(parents=True, exist_ok=True)
    for path in KERNELS.iterdir():
        if path.suffix not in (".h", ".cuh", ".cu"):
            continue
        text = path.read_text()
        if path.name == kernel:
            for old, new in (changes or {}).items():
                assert old in text, f"{old!r} is not in {kernel}"
                text = text.replace(old, new)
        for old, new in PTX.items():
            text = text.replace(old, new)
        if path.suffix == ".cu":
            text = rewrite_launches(text)
        (copy / path.name).write_text(text)
    library = folder / f"emulated_{Path(kernel).stem}.so"
    compiler = os.environ.get("CXX", "g++")
    subprocess.run([compiler, "-std=c++17", "-O2", "-shared", "-fPIC", "-w", f"-I{HERE}", f"-I{copy}", "-x", "c++",
                    str(copy / kernel), str(HERE / driver), "-o", str(library)], check=True)
    return library


class EmulatedLongPairs:
    """The engine's tiles of long pairs (sw_cuda_long_forward / _backward), emulated, on numpy arrays. Every
    buffer the kernels fill starts as NaN, so an element they leave unwritten shows."""

    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        sizes = (ctypes.c_int64,) * 3
        for name in ("emu_state_floats", "emu_tiles", "emu_flow_floats"):
            getattr(lib, name).restype = ctypes.c_int64
            getattr(lib, name).argtypes = sizes
        lib.emu_forward.argtypes = sizes + (ctypes.c_void_p,) * 9 + (ctypes.c_double,) * 2
        lib.emu_backward.argtypes = sizes + (ctypes.c_void_p,) * 8 + (ctypes.c_double,) * 2
        self.lib = lib

    @staticmethod
    def _pointer(array):
        return None if array is None else array.ctypes.data_as(ctypes.c_void_p)

    def forward(self, S: np.ndarray, qlen, tlen, gap: float, t: float):
        """(scores, best_at, state, pairs counted in log space) of float32 S (B, M, N)."""
        B, M, N = S.shape
        p = self._pointer
        S = np.ascontiguousarray(S, dtype=np.float32)
        qlen = None if qlen is None else np.ascontiguousarray(qlen, dtype=np.int64)
        tlen = None if tlen is None else np.ascontiguousarray(tlen, dtype=np.int64)
        scores, best_at = np.full(B, np.nan, np.float32), np.full(B, -2, np.int64)
        state = np.full(self.lib.emu_state_floats(B, M, N), np.nan, np.float32)
        tiles = self.lib.emu_tiles(B, M, N)
        tile_best, tile_at = np.full(tiles, np.nan, np.float32), np.full(tiles, -2, np.int64)
        counted = np.zeros(1, np.int32)
        error = self.lib.emu_forward(B, M, N, p(qlen), p(tlen), p(S), p(scores), p(best_at), p(state), p(tile_best),
                                     p(tile_at), p(counted), gap, t)
        assert error == 0
        return scores, best_at, state, int(counted[0])

    def backward(self, grad: np.ndarray, S: np.ndarray, qlen, tlen, state, best_at, gap: float, t: float) -> np.ndarray:
        """d (sum of grad * scores) / d S from forward's state and best_at."""
        B, M, N = S.shape
        p = self._pointer
        S = np.ascontiguousarray(S, dtype=np.float32)
        qlen = None if qlen is None else np.ascontiguousarray(qlen, dtype=np.int64)
        tlen = None if tlen is None else np.ascontiguousarray(tlen, dtype=np.int64)
        grad = np.ascontiguousarray(grad, dtype=np.float32)
        grad_S = np.full((B, M, N), np.nan, np.float32)
        flows = np.full(self.lib.emu_flow_floats(B, M, N), np.nan, np.float32)
        error = self.lib.emu_backward(B, M, N, p(qlen), p(tlen), p(grad), p(S), p(state), p(best_at), p(grad_S),
                                      p(flows), gap, t)
        assert error == 0
        return grad_S

# 32-bit words past a search kernel's edge buffer, which a kernel must leave as they are.
CANARY = 64


class EmulatedSearchS16:
    """The exact 16-bit search kernel (sw_cuda_search_s16), emulated, on numpy arrays: one query's scores
    against padded targets, -1 where 16 bits could not hold a pair, and the count of those."""

    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        lib.emu_search_s16.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.emu_warp_columns.argtypes = [ctypes.c_int] * 5
        lib.emu_search_s16_edge_bytes.restype = ctypes.c_int64
        lib.emu_search_s16_edge_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        self.lib = lib

    def warp_columns(self, lanes: int, widest: int, most: int, step: int, fewest: int = 16) -> int:
        """common.cuh's warp_columns, as both search kernels take it."""
        return self.lib.emu_warp_columns(lanes, widest, most, step, fewest)

    def scores(self, query: np.ndarray, targets: np.ndarray, lengths: np.ndarray, exact) -> tuple[np.ndarray, int]:
        """(scores (B,) int32, overflows) of uint8 query (M,) against uint8 targets (B, N) with lengths (B,),
        with a search.ExactSearch's table, gaps and limit."""
        table, gap_open, gap_extend, limit = exact.table.numpy(), exact.gap_open, exact.gap_extend, exact.limit
        query = np.ascontiguousarray(query, dtype=np.uint8)
        targets = np.ascontiguousarray(targets, dtype=np.uint8)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        table = np.ascontiguousarray(table, dtype=np.int32)
        (B, N), M, K = targets.shape, len(query), table.shape[0]
        scores = np.full(B, -7, np.int32)  # never a score nor the flag: a pair left unwritten shows
        overflows = np.zeros(1, np.int32)
        edge_bytes = self.lib.emu_search_s16_edge_bytes(B, M, N, int(gap_open != gap_extend))
        boundary = np.full(edge_bytes // 4 + CANARY, 0x7fff7fff, np.uint32) if edge_bytes else None
        p = lambda a: None if a is None else a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        error = self.lib.emu_search_s16(p(query), M, p(targets), N, B, p(lengths), p(table), K, gap_open, gap_extend,
                                        limit, p(scores), p(overflows), p(boundary))
        assert error == 0
        assert boundary is None or (boundary[edge_bytes // 4:] == 0x7fff7fff).all(), "a write past the edge buffer"
        return scores, int(overflows[0])


class EmulatedSearchSoft:
    """The soft search kernel (sw_cuda_search_soft), emulated, on numpy arrays: one query's scores at t > 0
    against padded targets, -1 where the kernel's checks did not hold, and the count of those."""

    def __init__(self, library: Path):
        lib = ctypes.CDLL(str(library))
        lib.emu_search_soft.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                        ctypes.c_float, ctypes.c_float, ctypes.c_int, ctypes.c_int,
                                        ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.emu_search_soft_scratch_bytes.restype = ctypes.c_int64
        lib.emu_search_soft_scratch_bytes.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        self.lib = lib

    def scores(self, query: np.ndarray, targets: np.ndarray, lengths: np.ndarray, plan: dict,
               warps: int = 3) -> tuple[np.ndarray, int]:
        """(scores (B,) float32, flagged) of uint8 query (M,) against uint8 targets (B, N) with lengths (B,),
        with search.SoftSearch.plan's settings (its powers included), by a launch of `warps` warps (at most
        B). The emulation runs a launch's blocks one after another: with one warp a block, the first takes
        every target."""
        query = np.ascontiguousarray(query, dtype=np.uint8)
        targets = np.ascontiguousarray(targets, dtype=np.uint8)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        powers = np.ascontiguousarray(plan["powers"], dtype=np.float32)
        (B, N), M, K = targets.shape, len(query), powers.shape[0]
        warps = max(min(warps, B), 1)
        scores = np.full(B, np.nan, np.float32)  # a pair left unwritten shows
        flagged = np.zeros(1, np.int32)
        scratch_bytes = self.lib.emu_search_soft_scratch_bytes(B, M, warps, int(plan["affine"]))
        scratch = np.full(scratch_bytes + 4 * CANARY, 0xff, np.uint8)
        p = lambda a: None if a is None else a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        error = self.lib.emu_search_soft(p(query), M, p(targets), N, B, p(lengths), p(powers), K,
                                         int(plan["affine"]), plan["gap_factor"], plan["extend_factor"], plan["upper"],
                                         plan["middle"], plan["floor"], plan["bound"],
                                         plan["temperature"] * 0.6931471805599453, p(scores), p(flagged), p(scratch),
                                         warps)
        assert error == 0
        assert (scratch[scratch_bytes:] == 0xff).all(), "a write past the scratch buffer"
        return scores, int(flagged[0])
