#!/usr/bin/env bash
# Rebuilds the pair shipped in python/specpilot/data/pair on a CPU (about 45 minutes on 2 busy cores):
# corpus (this python's site-packages, the standard library held out, the zoo tokenizer), the target
# (embedding started from the zoo target's principal directions), its DFlash drafter, the held-out
# measurement. Needs the zoo (shared/zoo: its recipe, tokenizer and target) and `dflash` installed.
#   ZOO=../shared/zoo WORK=/tmp/pair bash scripts/embedded_pair/build.sh
# On a GPU: DEVICE=cuda TIME_PCT=10 TARGET_BATCH=128 DRAFT_BATCH=128 (every stage's seconds cut to TIME_PCT
# percent of the CPU budgets below; the GPU takes far more steps in them, with larger batches).
set -euo pipefail
cd "$(dirname "$0")/../.."
ZOO=${ZOO:-../shared/zoo}
WORK=${WORK:-/tmp/specpilot-pair}
DEST=${DEST:-python/specpilot/data/pair}
DEVICE=${DEVICE:-cpu}
PY=${PY:-python}
TARGET_BATCH=${TARGET_BATCH:-16}
INIT=${INIT:-}
DRAFT_BATCH=${DRAFT_BATCH:-32}   # the first drafter run's; the two that continue it take half
secs() { echo $(( $1 * ${TIME_PCT:-100} / 100 )); }
export OMP_NUM_THREADS=${THREADS:-1} SPECPILOT_ZOO_RECIPE="$ZOO/recipe"   # default one: on a shared CPU, two spin-wait
mkdir -p "$WORK"
nice $PY "$ZOO/recipe/build_corpus.py" corpus --tokenizer "$ZOO/code-tiny/tokenizer.json" --limit-mb 32 \
    --n-prompts 50 --out "$WORK/data"
[ -z "$INIT" ] || cp "$INIT/train_stats.json" "$WORK/continued_from.json"
nice $PY scripts/embedded_pair/train_target_pca.py --zoo-target "$ZOO/code-tiny" ${INIT:+--init $INIT/target} --data "$WORK/data" \
    --out "$WORK/target" --device $DEVICE --compile 0 --hidden 128 --layers 4 --heads 4 --kv-heads 2 --ffn 384 \
    --seq 256 --batch $TARGET_BATCH --lr 3e-3 --seconds $(secs 1500) --reserve 40
# the drafter in three runs, each continuing the last: smaller batches (more steps), then prompts as long
# as the demo's (128, 160 tokens)
DRAFT="--layer-ids 1,2,3 --target $WORK/target --data $WORK/data --device $DEVICE --gen-batch 256 --gen-new 128 \
    --prompt-lens 32,64 --anchors 16 --reserve 20"
nice $PY scripts/embedded_pair/train_drafter_layers.py $DRAFT ${INIT:+--init $INIT/drafter} --out "$WORK/drafter1" --seconds $(secs 480) \
    --gen-seconds $(secs 120) --batch $DRAFT_BATCH
nice $PY scripts/embedded_pair/train_drafter_layers.py $DRAFT --init "$WORK/drafter1" --out "$WORK/drafter2" \
    --seconds $(secs 560) --gen-seconds $(secs 100) --batch $((DRAFT_BATCH / 2)) --lr 1e-3 --warmup-frac 0.01
nice $PY scripts/embedded_pair/train_drafter_layers.py $DRAFT --init "$WORK/drafter2" --out "$WORK/drafter" \
    --seconds $(secs 400) --gen-seconds $(secs 60) --batch $((DRAFT_BATCH / 2)) --lr 7e-4 --warmup-frac 0.01 --gen-batch 128 --gen-new 96 \
    --prompt-lens 128,160
nice $PY scripts/embedded_pair/measure.py --target "$WORK/target" --drafter "$WORK/drafter" \
    --prompts "$WORK/data/prompts/pystdlib.jsonl" --strip-final-newline --out "$WORK/measure.json"
$PY scripts/embedded_pair/assemble.py --work "$WORK" --dest "$DEST" --earlier-drafter-runs drafter1,drafter2
