"""The Triton GEMM kernels' tile configurations by shape, without importing Triton: the launchers
(:mod:`.gemm`) take them, and the cost estimates (:mod:`.catalog.gemm`) count the SMs their tiles fill."""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernel_switchboard.availability import triton_interpreting


class Tiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def mm_tiles(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> Tiles:
    """Tile configuration of a matmul by shape (Hopper-class GPUs; small tiles when interpreted)."""
    if triton_interpreting():
        return Tiles(32, 32, 32, 4, 4, 1)
    if dtype == torch.float32:  # exact float32 products run on CUDA cores: modest tiles
        return Tiles(64 if m <= 64 else 128, 128, 32, 8, 8, 3)
    if m <= 16:
        return Tiles(16, 64, 128, 1, 4, 4)
    if m <= 64:
        return Tiles(64, 128, 64, 4, 4, 4)
    if m * n <= 1024 * 1024:
        return Tiles(128, 128, 64, 8, 4, 4)
    return Tiles(128, 256, 64, 8, 8, 3)


def fp8_tiles(m: int, n: int, k: int, mode: str, tma: bool = False) -> Tiles:
    """Tile configuration of an fp8 matmul (``tma``: the persistent TMA kernel runs it); block mode needs
    BLOCK_K = 128 and BLOCK_N dividing 128. Small tiles when interpreted, else :func:`fp8_gpu_tiles`."""
    if triton_interpreting():
        return Tiles(32, 32, 128 if mode == "block" else 32, 4, 4, 1)
    return fp8_gpu_tiles(m, n, k, mode, tma)


def fp8_gpu_tiles(m: int, n: int, k: int, mode: str, tma: bool = False) -> Tiles:
    """The tiles of an fp8 matmul on a Hopper-class GPU, by shape (the pointer kernel below 65 rows)."""
    if m <= 64:
        return Tiles(64, 128, 128, 4, 4, 4)
    # every mode folds each BLOCK_K step into a float32 accumulator (sm_90 fp8 MMAs accumulate imprecisely), which
    # doubles the accumulator registers: 128x256 tiles spill and run at about half the rate of 128x128. 256x128
    # per-tensor tiles in the TMA kernel do not spill (ptxas, sm_90) and beat 128x128 on large problems; block
    # scales lose with them. ptxas still serialises their wgmma (C7514: the fold reads accumulators mid-stage; SASS
    # waits after every QGMMA), which 128x128 does not.
    if tma and mode == "tensor" and m > 128 and m * n > 1024 * 1024:
        return Tiles(256, 128, 128, 8, 8, 3)
    return Tiles(128, 128, 128, 8, 8, 4)
