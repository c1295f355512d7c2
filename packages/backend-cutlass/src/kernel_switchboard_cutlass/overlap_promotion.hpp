// Inlined by kernel_switchboard_cutlass.emit into fp8 GEMMs whose config sets overlap_promotion (after the
// prologue's CUTLASS includes; the build cache keys on the emitted text, so on this file too).
//
// Why: CUTLASS's sm90 fp8 mainloops (block-scaled, and per-tensor without fast accumulation) run each K tile's MMAs
// into a temporary accumulator, wait for them (wgmma.wait_group 0) and then fold them into the output on the CUDA
// cores (an FFMA with the block scales, or an FADD). Both consumer warpgroups of a cooperative tile wait on the same
// stage, so the tensor cores idle during every fold. Here two temporaries alternate: tile k's MMAs are issued before
// tile k - 1 (finished: wait_group 1) is folded in, so the fold runs under the next tile's MMAs. Cost: one more
// 64-float accumulator per thread at 128x128x128 (no spills, ptxas sm_90a).

namespace ksb {

template <class T>
CUTLASS_DEVICE T& pick(cute::Int<0>, T& first, T&) { return first; }
template <class T>
CUTLASS_DEVICE T& pick(cute::Int<1>, T&, T& second) { return second; }

// The K loop of both mainloops. `start(slot)` waits for the next K tile and issues its MMAs into temporary `slot`
// (cute::Int<0> or Int<1>, alternating); `fold(slot, first)` folds a finished tile into the output (`first`: sets it).
// A finished tile's stage is freed before it is folded (its operands and scales are in registers by then), K tiles
// 0 .. count - 2 here, as in CUTLASS's mainloops: the last is the collective's mma_tail's.
template <class Pipeline, class PipelineState, class Start, class Fold>
CUTLASS_DEVICE void overlapped_k_loop(int k_tile_count, Pipeline& pipeline, PipelineState release, Start&& start,
                                      Fold&& fold) {  // release: the first tile's stage, the next to free
  using cute::_0;
  using cute::_1;
  auto free_oldest = [&] {
    pipeline.consumer_release(release);
    ++release;
  };
  start(_0{});
  if (k_tile_count == 1) {
    cute::warpgroup_wait<0>();
    fold(_0{}, true);
    return;
  }
  start(_1{});
  cute::warpgroup_wait<1>();
  free_oldest();
  fold(_0{}, true);
  int left = k_tile_count - 2;  // tiles not started; temporary 1 holds the one in flight
  CUTLASS_PRAGMA_NO_UNROLL
  for (; left >= 2; left -= 2) {
    start(_0{});
    cute::warpgroup_wait<1>();
    free_oldest();
    fold(_1{}, false);
    start(_1{});
    cute::warpgroup_wait<1>();
    free_oldest();
    fold(_0{}, false);
  }
  if (left == 1) {
    start(_0{});
    cute::warpgroup_wait<1>();
    free_oldest();
    fold(_1{}, false);
    cute::warpgroup_wait<0>();
    fold(_0{}, false);
  } else {
    cute::warpgroup_wait<0>();
    fold(_1{}, false);
  }
}

// Issue K tile `stage`'s MMAs (the first zeroes `tmp`) as one wgmma group.
template <class TiledMma, class FragA, class FragB, class Accum>
CUTLASS_DEVICE void issue_tile(TiledMma& tiled_mma, FragA const& tCrA, FragB const& tCrB, int stage, Accum& tmp) {
  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  warpgroup_fence_operand(tmp);
  warpgroup_arrive();
  CUTLASS_PRAGMA_UNROLL
  for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
    cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), tmp);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tmp);
}

// This thread's warpgroup slice of `tiled_mma` (consumer warpgroups split the tile's rows).
template <class TiledMma>
CUTLASS_DEVICE auto warpgroup_slice(TiledMma& tiled_mma, int thread_idx) {
  constexpr int MmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
  auto warp_group_layout = make_layout(Int<MmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
  int warp_group = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
  return tiled_mma.get_slice(warp_group_layout(warp_group));
}

// CUTLASS's blockwise-fp8 mainloop (MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8, as its builder made it) with
// `mma` replaced: loads, shared memory and the pipeline protocol stay the base's. Folds accum += tmp * scale_a[row]
// * scale_b.
template <class Base>
struct OverlappedBlockScaled : Base {
  using typename Base::ElementBlockScale;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;
  static_assert(Base::ScaleMsPerTile > 1 && Base::ScaleNsPerTile == 1,
                "written for per-row scales of A and one scale of B per tile");
  static_assert(Base::ScaleGranularityK == size<2>(TileShape{}), "written for one promotion per K tile");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const&) {
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    // A's scales (one per row and K tile) as a (BLK_M, BLK_N, (K, PIPE)) tile broadcast along N; B's (1, K, PIPE)
    Tensor sSFA = make_tensor(make_smem_ptr(shared_tensors.smem_SFA.data()),
                              make_layout(make_shape(get<0>(shape(SmemLayoutSFA{})), get<1>(TileShape{}),
                                                     make_shape(get<1>(shape(SmemLayoutSFA{})),
                                                                get<2>(shape(SmemLayoutSFA{})))),
                                          make_stride(get<0>(stride(SmemLayoutSFA{})), _0{},
                                                      make_stride(get<1>(stride(SmemLayoutSFA{})),
                                                                  get<2>(stride(SmemLayoutSFA{}))))));
    Tensor sSFB = make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()), SmemLayoutSFB{});

    TiledMma tiled_mma;
    auto wg_mma = warpgroup_slice(tiled_mma, thread_idx);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE) descriptors
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (K, PIPE))

    // per K tile in flight: its partial products and its scales (this thread's rows of A times B's one)
    Tensor tmp0 = make_fragment_like(accum);
    Tensor tmp1 = make_fragment_like(accum);
    Tensor scale0 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor scale1 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    auto start = [&](auto slot) {
      auto& scale = pick(slot, scale0, scale1);
      pipeline.consumer_wait(smem_pipe_read);
      int stage = smem_pipe_read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), scale);
      ElementBlockScale scale_b = sSFB(_0{}, _0{}, stage);
      issue_tile(tiled_mma, tCrA, tCrB, stage, pick(slot, tmp0, tmp1));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(scale)); ++i) {
        filter_zeros(scale)(i) = filter_zeros(scale)(i) * scale_b;
      }
      ++smem_pipe_read;
    };
    auto fold = [&](auto slot, bool first) {
      auto& tmp = pick(slot, tmp0, tmp1);
      auto const& scale = pick(slot, scale0, scale1);
      warpgroup_fence_operand(tmp);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        accum(i) = first ? tmp(i) * scale(i) : accum(i) + tmp(i) * scale(i);
      }
    };
    overlapped_k_loop(k_tile_count, pipeline, smem_pipe_read, start, fold);  // (a copy: the first tile's stage)
    warpgroup_fence_operand(accum);
  }
};

// CUTLASS's fp8 mainloop without fast accumulation (MainloopSm90TmaGmmaWarpSpecializedFP8; the scales are the
// epilogue's alpha) with `mma` replaced. Folds accum += tmp once per K tile: the collective's default promotion
// interval (4 MMAs of K 32), which the emitted code leaves as it is.
template <class Base>
struct OverlappedPerTensor : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;
  static_assert(size<2>(TileShape{}) == 4 * size<2>(typename TiledMma::AtomShape_MNK{}),
                "written for a K tile of 4 MMAs, the default promotion interval");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const&) {
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    TiledMma tiled_mma;
    auto wg_mma = warpgroup_slice(tiled_mma, thread_idx);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));
    Tensor tmp0 = make_fragment_like(accum);
    Tensor tmp1 = make_fragment_like(accum);
    auto start = [&](auto slot) {
      pipeline.consumer_wait(smem_pipe_read);
      issue_tile(tiled_mma, tCrA, tCrB, smem_pipe_read.index(), pick(slot, tmp0, tmp1));
      ++smem_pipe_read;
    };
    auto fold = [&](auto slot, bool first) {
      auto& tmp = pick(slot, tmp0, tmp1);
      warpgroup_fence_operand(tmp);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        accum(i) = first ? tmp(i) : accum(i) + tmp(i);
      }
    };
    overlapped_k_loop(k_tile_count, pipeline, smem_pipe_read, start, fold);  // (a copy: the first tile's stage)
    warpgroup_fence_operand(accum);
  }
};

}  // namespace ksb
