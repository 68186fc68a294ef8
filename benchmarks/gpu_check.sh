#!/usr/bin/env bash
# The CUDA paths of both scripts, on one GPU, in under 10 minutes. Not part of CI (no GPU there).
#
#     bash benchmarks/gpu_check.sh          # from the repository root, with the project installed
#
# 1. ppo_atari_multigpu.py, one rank on cuda:0, ~2 minutes: SPS, where an iteration's time goes, peak GPU memory.
# 2. ppo_vec.py on CUDA for a few iterations (CartPole, then Pendulum with a checkpoint, a resume and an evaluation).
# 3. torchrun with 2 ranks on that one GPU: nccl if it takes two ranks per device, else gloo (said which).
# 4. The scaling model's GPU parts measured (inference per step, update per iteration) and its predictions from them.
# Any error ends it with a non-zero status and the failing command's output.
set -euo pipefail
cd "$(dirname "$0")/.."
# On a node without the project installed: the packages gpu_side_by_side.sh installed there for ours
[ -d benchmarks/.gpu_peers/site/ours ] && export PYTHONPATH="$PWD/benchmarks/.gpu_peers/site/ours${PYTHONPATH:+:$PYTHONPATH}"
out=$(mktemp -d)
smi=""
trap '[ -z "$smi" ] || kill "$smi" 2>/dev/null || true' EXIT
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
nproc

step() { echo; echo "== $*"; }

step "1. Atari, one rank on cuda:0"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/memory.txt" &
smi=$!
(cd "$out" && timeout 240 python "$OLDPWD/ppo_atari_multigpu.py" --total-timesteps 300000 --local-num-envs 16 \
    --checkpoint-interval 20) | tee "$out/atari.txt" | grep -E "^ppo_atari|SPS=" | tail -n 4
kill "$smi"
grep -q "global_step=" "$out/atari.txt"
echo "peak GPU memory in use (whole device): $(sort -n "$out/memory.txt" | tail -n 1) MiB"

step "2. ppo_vec.py on CUDA"
(cd "$out" && timeout 120 python "$OLDPWD/ppo_vec.py" --env-id CartPole-v1 --total-timesteps 20480 | tail -n 2)
(cd "$out" && timeout 120 python "$OLDPWD/ppo_vec.py" --env-id Pendulum-v1 --total-timesteps 8192 --checkpoint-interval 2 \
    --exp-name gpu_pendulum | tail -n 1)
checkpoint=$(ls -d "$out"/runs/Pendulum-v1__gpu_pendulum__*/checkpoint.pt)
(cd "$out" && timeout 120 python "$OLDPWD/ppo_vec.py" --env-id Pendulum-v1 --total-timesteps 16384 --resume "$checkpoint" \
    | tail -n 1)
(cd "$out" && timeout 120 python "$OLDPWD/ppo_vec.py" --eval-checkpoint "$checkpoint" --eval-episodes 2)

step "3. torchrun, 2 ranks on one GPU"
run2() {
    (cd "$out" && timeout 240 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        "$OLDPWD/ppo_atari_multigpu.py" --device-ids 0 0 --local-num-envs 4 --total-timesteps 20480 "$@")
}
if run2 > "$out/nccl.txt" 2>&1; then
    echo "nccl took two ranks on one device"; grep -E "SPS=|checksum" "$out/nccl.txt" | tail -n 2
else
    echo "nccl refused two ranks on one device ($(grep -m1 -iE "nccl|error" "$out/nccl.txt" || true)); gloo instead"
    run2 --backend gloo 2>&1 | tee "$out/gloo.txt" | grep -E "SPS=|checksum" | tail -n 2
    grep -q "final parameter checksum" "$out/gloo.txt"
fi

step "4. the scaling model, its measured parts on this GPU"
timeout 300 python benchmarks/scaling_model.py --measure --device cuda --cores-per-gpu "$(nproc)"

echo; echo "gpu_check: all passed (outputs in $out)"
