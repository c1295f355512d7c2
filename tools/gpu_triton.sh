# source tools/gpu_triton.sh -- on the GPU machine: install the project, unpack the Triton bundles copied to
# /tmp/gpu-stash (tools/triton_bundle.sh), and define `tv NN cmd ...`, which runs cmd on Triton NN (36: the
# installed one; 37, 39, ...: a bundle) with its own kernel cache. Example, the Triton GPU tests on Triton 3.7:
#   tv 37 python3 -m pytest -m gpu packages/backend-triton/tests
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e packages/core -e packages/backend-triton \
  > /dev/null 2>&1
for _b in /tmp/gpu-stash/t*/t*.tar.xz; do
  [ -f "$_b" ] || continue
  _v=$(basename "$_b" .tar.xz)
  [ -d "/tmp/$_v/triton" ] || { mkdir -p "/tmp/$_v" && tar -C "/tmp/$_v" -xJf "$_b"; }
done
PTXAS13=$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)
export KSB_TEST_DEVICE=cuda PYTHONUNBUFFERED=1
tv() {  # tv NN cmd...: the bundle's triton ahead of the installed one; in-tree backends only (an installed 3.6 registers AMD)
  local v=$1; shift
  local pp=$PYTHONPATH
  if [ "$v" != 36 ]; then
    [ -d "/tmp/t$v/triton" ] || { echo "tv: Triton bundle t$v is not on this machine" >&2; return 3; }
    pp=/tmp/t$v${PYTHONPATH:+:$PYTHONPATH}
  fi
  PYTHONPATH=$pp TRITON_CACHE_DIR=/tmp/tc$v TRITON_PTXAS_BLACKWELL_PATH=$PTXAS13 TRITON_DEFAULT_FP_FUSION=1 \
    TRITON_BACKENDS_IN_TREE=1 "$@"
}
