// Inlined by kernel_switchboard_cutlass.emit into fp8 block-scaled GEMMs whose config sets overlap_promotion
// (after the prologue's CUTLASS includes; the build cache keys on the emitted text, so on this file too).
//
// Why: CUTLASS's sm90 blockwise-fp8 mainloop runs each K tile's MMAs into a temporary accumulator, waits for them
// (wgmma.wait_group 0) and then scales them into the output with CUDA-core FFMAs. Both consumer warpgroups of a
// cooperative tile wait on the same stage, so the tensor cores idle during every promotion. Here two temporaries
// alternate: tile k's MMAs are issued before tile k - 1 (finished: wait_group 1) is folded into the output, so the
// promotion runs under the next tile's MMAs. Cost: one more 64-float accumulator per thread (no spills at
// 128x128x128, ptxas sm_90a).

namespace ksb {

// The collective mainloop ``Base`` (CUTLASS's MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8 as its builder made
// it) with ``mma`` replaced: loads, shared memory and the pipeline protocol stay the base's. Like the base, ``mma``
// releases K tiles 0 .. count - 2 as they finish and leaves the last to ``mma_tail``.
template <class Base>
struct OverlappedPromotion : Base {
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

    constexpr int MmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    auto warp_group_layout = make_layout(Int<MmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    int warp_group = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(warp_group_layout(warp_group));
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE) descriptors
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (K, PIPE))

    // per K tile in flight: its partial products and its scales (this thread's rows of A times B's one)
    Tensor tmp0 = make_fragment_like(accum);
    Tensor tmp1 = make_fragment_like(accum);
    Tensor scale0 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor scale1 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    PipelineState smem_pipe_release = smem_pipe_read;

    // wait for the next K tile, start its MMAs into `tmp` (the first one zeroes it), read its scales into `scale`
    auto start = [&](auto& tmp, auto& scale) {
      pipeline.consumer_wait(smem_pipe_read);
      int stage = smem_pipe_read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), scale);
      ElementBlockScale scale_b = sSFB(_0{}, _0{}, stage);
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
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(filter_zeros(scale)); ++i) {
        filter_zeros(scale)(i) = filter_zeros(scale)(i) * scale_b;
      }
      ++smem_pipe_read;
    };
    // a finished K tile (after the wait_group that covers it): fold it into accum (the first sets it) and, unless
    // it is the last (mma_tail's), free its stage
    auto fold = [&](auto& tmp, auto const& scale, bool first, bool release) {
      warpgroup_fence_operand(tmp);
      if (release) {
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        accum(i) = first ? tmp(i) * scale(i) : accum(i) + tmp(i) * scale(i);
      }
    };

    start(tmp0, scale0);
    if (k_tile_count == 1) {
      warpgroup_wait<0>();
      fold(tmp0, scale0, true, false);
      return;
    }
    start(tmp1, scale1);
    warpgroup_wait<1>();
    fold(tmp0, scale0, true, true);
    int left = k_tile_count - 2;  // tiles not started; tmp1 holds the one in flight
    CUTLASS_PRAGMA_NO_UNROLL
    for (; left >= 2; left -= 2) {
      start(tmp0, scale0);
      warpgroup_wait<1>();
      fold(tmp1, scale1, false, true);
      start(tmp1, scale1);
      warpgroup_wait<1>();
      fold(tmp0, scale0, false, true);
    }
    if (left == 1) {
      start(tmp0, scale0);
      warpgroup_wait<1>();
      fold(tmp1, scale1, false, true);
      warpgroup_wait<0>();
      fold(tmp0, scale0, false, false);
    } else {
      warpgroup_wait<0>();
      fold(tmp1, scale1, false, false);
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace ksb
