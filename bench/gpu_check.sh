#!/usr/bin/env bash
# The GPU check: from a clean tree on a bare machine (no network), build the extension with CUDA
# (sm_90a), run the GPU tests, run the kernel / engine / agent benchmarks, print a short table last.
# Logs and JSON go to $OUT (the device tool's folder) or out/gpu_check.
# Usage: bash bench/gpu_check.sh [build|prebuilt|tests|trees|split12|gemv|skinny|linear_rows|engine|ab|defaults_ab|cost_8b|agents|agents_demo|bench_zoo|bench_hybrid_zoo|bench_8b|scale_8b|five_8b|batch|batch_hybrid|batch_profile|drafters|hybrid|hybrid_27b|hybrid_hf|gdn_trees|trees_real|prefix_first|draft_vocab|gdn_fla|embedded_pair|paged|serve|results ...]
# (GPU_TESTS: the test files the tests step runs, default all; BATCH_TESTS=0: the batch step without its tests; DEADLINE: see the loop below;
#  PACK_TO=FILE.tgz: $OUT re-packed into FILE after every step, e.g. OUT=/tmp/x PACK_TO=$DEVICE_OUT/x.tgz, so that a call
#  cut off by the device's time limit still returns every log so far, in one file past its 8-file limit)
# (default: all but prebuilt, in order). `prebuilt` replaces `build` when device time is short: it stages
# the package in /tmp/sp with the extension that scripts/prebuild_cuda_ext.sh made on a CPU machine
# (carried in .prebuilt/), so the device compiles nothing: `bash bench/gpu_check.sh prebuilt tests ...`;
# where that extension is missing, was built from other sources or does not load, it builds instead.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=${*:-build tests split12 gemv skinny engine ab agents bench_zoo bench_8b results}
summary="$OUT/summary.txt"
: > "$summary"

note() { printf '%-10s %s\n' "$1" "$2" | tee -a "$summary"; }

# Stock dflash comes from the carried wheel (.whl/, fetched on a networked machine with pip download).
if ! python3 -c "import dflash" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/dflash-*.whl \
    || { echo "stock dflash is missing: put dflash-0.1.0-py3-none-any.whl in .whl/ (pip download --no-deps dflash==0.1.0)"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# The zoo pair and datasets travel inside the checkout when ../shared is not there; a checkpoint may
# travel xz-compressed (model.safetensors.xz: bf16 weights shrink ~30%, so a pair fits the call's 64 MiB).
for packed in shared/zoo/*/model.safetensors.xz; do
  [ -f "$packed" ] || continue
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], 'wb'))" "$packed" \
    && rm "$packed" || { echo "could not unpack $packed"; exit 1; }
done
[ -d shared/zoo ] && export SPECPILOT_ZOO=${SPECPILOT_ZOO:-shared/zoo}
[ -d shared/datasets ] && export SPECPILOT_DATASETS=${SPECPILOT_DATASETS:-shared/datasets}

run_step() {  # name, command...
  local name=$1; shift
  local t0=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then note "$name" "ok (${dt}s)"; else note "$name" "FAILED rc=$rc (${dt}s), see $name.log"; tail -30 "$OUT/$name.log"; fi
  if [ -n "${PACK_TO:-}" ]; then
    tar czf "$PACK_TO.part" -C "$(dirname "$OUT")" "$(basename "$OUT")" && mv "$PACK_TO.part" "$PACK_TO"
  fi
  return $rc
}

with_fla() {  # fla-core and einops from .whl/fla (pip download --no-deps fla-core einops), on PYTHONPATH
  python3 -c "import fla" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla/*.whl
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
}

build_here() {  # a clean CUDA build of the extension, installed editable
  rm -rf build python/specpilot/_C*.so
  python3 -m pip install --no-build-isolation --no-deps --no-index -e . && python3 -m specpilot env --json > "$OUT/env.json"
}

stage_prebuilt() {  # the extension scripts/prebuild_cuda_ext.sh built from these very sources, with the package, in /tmp/sp
  [ "$(cat .prebuilt/sources.sha256 2>/dev/null)" = "$(bash bench/ext_sources_hash.sh)" ] \
    || { echo "no extension in .prebuilt/ built from these sources (scripts/prebuild_cuda_ext.sh)"; return 1; }
  rm -rf /tmp/sp && python3 -c "import glob, lzma, os, setup, shutil
for name, folder in setup.PACKAGE_DIRS.items(): shutil.copytree(folder, '/tmp/sp/' + name.replace('.', '/'))
for packed in glob.glob('.prebuilt/_C.*.so.xz'):  # the extension, xz-compressed by the prebuild script
    open('/tmp/sp/specpilot/' + os.path.basename(packed)[:-3], 'wb').write(lzma.open(packed).read())" \
    && PYTHONPATH=/tmp/sp${PYTHONPATH:+:$PYTHONPATH} python3 -c \
         "from specpilot import _ext; assert _ext.has_cuda_kernels(); print(_ext.build_info())"
}

for step in $steps; do
  # DEADLINE (epoch seconds): steps not started by then are skipped, so a call's last steps and its
  # table still fit the device's per-call limit.
  if [ -n "${DEADLINE:-}" ] && [ "$(date +%s)" -ge "$DEADLINE" ]; then note "$step" "skipped (DEADLINE)"; continue; fi
  case $step in
    build)   run_step build build_here || exit 1 ;;
    prebuilt) if run_step prebuilt stage_prebuilt; then export PYTHONPATH=/tmp/sp${PYTHONPATH:+:$PYTHONPATH}
              else run_step build build_here || exit 1; fi ;;
    tests)   run_step tests timeout ${TESTS_S:-580} python3 -m pytest -q -m gpu --durations=10 ${GPU_TESTS:-tests}
             tail -1 "$OUT/tests.log" | tee -a "$summary" ;;
    split12) run_step split12 python3 -m specpilot.bench.split12_kernels --out "$OUT/split12.jsonl" ;;
    gemv)    run_step gemv python3 -m specpilot.bench.gemv_kernels --out "$OUT/gemv.jsonl" ;;
    skinny)  run_step skinny timeout 400 python3 -m specpilot.bench.skinny_kernels --sweep --split12 --out "$OUT/skinny.jsonl" ;;
    linear_rows) run_step linear_rows timeout ${LINEAR_ROWS_S:-200} python3 -m specpilot.bench.linear_rows --blas ${LINEAR_BLAS:-cublas} \
                   --out "$OUT/linear_rows.jsonl" ;;
    # The engine on the zoo pair (bf16 token forcing against stock), then the scale pair's step times
    # in both weight formats, interleaved (bench/engine_ab.py).
    engine)  if [ -n "${SPECPILOT_ZOO:-}" ] && [ -d "$SPECPILOT_ZOO/code-tiny" ]; then
               run_step force_zoo python3 -m specpilot verify --target "$SPECPILOT_ZOO/code-tiny" \
                 --drafter "$SPECPILOT_ZOO/code-tiny-dflash-b16" --prompts "$SPECPILOT_ZOO/prompts/humaneval.jsonl" \
                 --limit 8 --max-new-tokens 128 --device cuda --dtype bf16
               tail -1 "$OUT/force_zoo.log" | tee -a "$summary"
             fi
             run_step engine python3 -m specpilot.bench.engine_ab --preset qwen3-8b \
               --configs default,weights=split12 --out "$OUT/engine.jsonl" ;;
    # Each default against its alternative, one EngineConfig field at a time, with whole replayed
    # generations (host time between steps counts for the loop's mechanisms).
    # The field names below are checked against EngineConfig by tests/test_bench_engine_ab.py.
    ab)      run_step ab timeout 400 python3 -m specpilot.bench.engine_ab --preset qwen3-8b --e2e \
               --configs default,early_launch=false,step_kernels=false --out "$OUT/ab.jsonl" ;;
    # The defaults chosen on H100s, A/B'd again on the card in hand: the split12 decode-bound grid and
    # the fused one-token GEMV, with split12 weights. ~5 min.
    defaults_ab) run_step defaults_ab timeout 400 python3 -m specpilot.bench.engine_ab --preset qwen3-8b \
                   --configs weights=split12,weights=split12+split12_decode_grid=false,weights=split12+fused_gemv=false \
                   --out "$OUT/defaults_ab.jsonl" ;;
    # The cost model on the Qwen3-8B pair's configs (no weights): each step against its ceilings on
    # this card, both formats, with the picture (~1 min).
    cost_8b) CFG=/tmp/specpilot_cfg8b
             run_step cost_cfg python3 -m specpilot.bench.random_checkpoint --preset qwen3-8b --out "$CFG" --configs-only
             for w in bf16 split12; do
               run_step cost_$w python3 -m specpilot cost --target "$CFG/target" --drafter "$CFG/drafter" --tau 6.49 \
                 --context 512 --weights $w --device cuda --plot "$OUT/cost_$w.png"
             done ;;
    agents)  run_step agents python3 -m specpilot.bench.gpu_agents --out "$OUT" --total-budget ${AGENTS_BUDGET:-280} ;;
    # Real-acceptance tier: the zoo pair on its held-out prompts (all methods, side by side).
    bench_zoo) run_step bench_zoo python3 -m specpilot bench --target "$SPECPILOT_ZOO/code-tiny" \
               --drafter "$SPECPILOT_ZOO/code-tiny-dflash-b16" --datasets "$SPECPILOT_ZOO/prompts" \
               --benchmarks humaneval,pystdlib --limit ${ZOO_LIMIT:-12} --max-new-tokens 256 \
               --methods hf_ar,our_ar,stock,our_spec --out "$OUT/bench_zoo" ;;
    # The zoo hybrid pair end to end (real tier): transformers' greedy AR (its own cache; fla's kernels
    # when the gdn_fla step installed them first) beside our AR and spec.
    bench_hybrid_zoo) run_step bench_hybrid_zoo timeout ${HYBRID_ZOO_S:-200} python3 -m specpilot bench \
               --target "$SPECPILOT_ZOO/hybrid-tiny" --drafter "$SPECPILOT_ZOO/hybrid-tiny-dflash-b16" \
               --datasets "$SPECPILOT_ZOO/prompts" --benchmarks humaneval,pystdlib --limit ${ZOO_LIMIT:-12} \
               --max-new-tokens 256 --methods hf_static,our_ar,our_spec --out "$OUT/bench_hybrid_zoo" ;;
    # Scale tier: Qwen3-8B shapes, random weights, DFlash's published tau 6.49 replayed.
    bench_8b)  run_step bench_8b python3 -m specpilot bench --target random:qwen3-8b --methods our_ar,our_spec \
               --replay 6.49 --benchmarks gsm8k,humaneval --limit 2 --max-new-tokens 256 \
               --datasets "$SPECPILOT_DATASETS" --out "$OUT/bench_8b" ;;
    # Scale tier on disk: a random Qwen3-8B-shape pair that stock and HF can load too. bf16 token
    # forcing against stock, then HF static-cache AR (the issue's baseline) beside ours, same prompts,
    # both weight formats in the one run.
    scale_8b)  R8=${SCALE_DIR:-/tmp/specpilot_r8b}
               [ -f "$R8/target/config.json" ] || run_step write_8b python3 -m specpilot.bench.random_checkpoint \
                 --preset qwen3-8b --out "$R8" --device cuda
               run_step force_8b python3 -m specpilot verify --target "$R8/target" --drafter "$R8/drafter" \
                 --prompts "$SPECPILOT_DATASETS/gsm8k.jsonl" --limit ${FORCE_LIMIT:-2} --max-new-tokens 64 \
                 --device cuda --dtype bf16 --referee-device ${REFEREE_DEVICE:-auto}
               tail -1 "$OUT/force_8b.log" | tee -a "$summary"
               run_step hf_8b python3 -m specpilot bench --target "$R8/target" --drafter "$R8/drafter" \
                 --weights ${SCALE_WEIGHTS:-bf16,split12} \
                 --methods ${SCALE_METHODS:-hf_static,our_ar,our_spec} --replay 6.49 --benchmarks gsm8k --limit 2 \
                 --max-new-tokens 256 --datasets "$SPECPILOT_DATASETS" --out "$OUT/hf_8b" ;;
    # The issue's benchmark at scale: the five benchmarks x 2048 new tokens (MT-Bench's two turns),
    # HF static beside both weight formats in one run (~7 min on an H100; FIVE_LIMIT prompts each).
    five_8b)   R8=${SCALE_DIR:-/tmp/specpilot_r8b}
               [ -f "$R8/target/config.json" ] || run_step write_8b python3 -m specpilot.bench.random_checkpoint \
                 --preset qwen3-8b --out "$R8" --device cuda
               run_step five_8b python3 -m specpilot bench --target "$R8/target" --drafter "$R8/drafter" \
                 --weights ${SCALE_WEIGHTS:-bf16,split12} --methods hf_static,our_ar,our_spec --replay 6.49 \
                 --limit ${FIVE_LIMIT:-1} --max-new-tokens 2048 --datasets "$SPECPILOT_DATASETS" --out "$OUT/five_8b" ;;
    # This tree against another revision staged in tree/ (scripts/stage_tree.sh REV): the Qwen3-8B
    # pair's AR, verify16 and draft steps and a replayed generation, both weight formats, in
    # alternating processes (scripts/ab_trees.py; ~5 min).
    trees)   [ -f tree/REVISION ] || { echo "trees: stage a revision first (scripts/stage_tree.sh REV)"; exit 2; }
             rm -rf /tmp/sp_tree && (cd tree && python3 -c "import glob, lzma, shutil
for name, folder in {'specpilot': 'python/specpilot', 'specpilot.agents': 'agents', 'specpilot.bench': 'bench'}.items():
    shutil.copytree(folder, '/tmp/sp_tree/' + name.replace('.', '/'))
for packed in glob.glob('_C.*.so.xz'): open('/tmp/sp_tree/specpilot/' + packed[:-3], 'wb').write(lzma.open(packed).read())")
             [ -d /tmp/sp/specpilot ] || { echo "trees: run the prebuilt step first"; exit 2; }
             run_step trees python3 scripts/ab_trees.py --tree "$(cut -d' ' -f1 tree/REVISION)=/tmp/sp_tree" \
               --tree this=/tmp/sp --rounds ${TREES_ROUNDS:-2} --out "$OUT/trees.jsonl" ;;
    # The batched engine (engine/batch): its GPU tests, per-request forcing at C=8 on the zoo pair, the
    # scale tier under closed-loop clients (tau 6.49 replayed per request, 256 new tokens a request:
    # BATCH_TOKENS=1024 shrinks the prefill's share, ~2 minutes more) and the real tier at C=16.
    batch)   if [ "${BATCH_TESTS:-1}" = 1 ]; then
               run_step batch_tests timeout 120 python3 -m pytest -q -m gpu tests/test_batch_gpu.py tests/test_batch_adaptive_gpu.py
               tail -1 "$OUT/batch_tests.log" | tee -a "$summary"
             fi
             run_step batch_force timeout 150 python3 -m specpilot verify --target "$SPECPILOT_ZOO/code-tiny" \
               --drafter "$SPECPILOT_ZOO/code-tiny-dflash-b16" --prompts "$SPECPILOT_ZOO/prompts/humaneval.jsonl" \
               --limit 16 --max-new-tokens 128 --device cuda --dtype bf16 --concurrency 8
             grep '^verdict' "$OUT/batch_force.log" | tee -a "$summary"
             run_step batch_scale timeout ${BATCH_SCALE_S:-300} python3 -m specpilot bench --target random:qwen3-8b \
               --concurrency ${BATCH_LEVELS:-8,16,32} --replay 6.49 --datasets "$SPECPILOT_DATASETS" \
               --limit ${BATCH_LIMIT:-13} --max-new-tokens ${BATCH_TOKENS:-256} --dtype bf16 --out "$OUT/batch_scale" \
               ${BATCH_ABLATIONS:+--ablations $BATCH_ABLATIONS} ${BATCH_PREFILL:+--prefill-chunk $BATCH_PREFILL}
             [ "${BATCH_ZOO_S:-150}" = 0 ] || run_step batch_zoo timeout ${BATCH_ZOO_S:-150} python3 -m specpilot bench --target "$SPECPILOT_ZOO/code-tiny" \
               --drafter "$SPECPILOT_ZOO/code-tiny-dflash-b16" --concurrency 1,16 --limit 32 --max-new-tokens 128 \
               --datasets "$SPECPILOT_ZOO/prompts" --benchmarks humaneval,pystdlib --dtype bf16 --out "$OUT/batch_zoo" ;;
    # The batched engine on hybrid targets (eager): its GPU tests, the zoo hybrid pair's verdict at C=8,
    # the zoo hybrid pair's real-tier speedups over batched AR and the Qwen3.5-9B shape's at a replayed tau.
    batch_hybrid) run_step batch_hybrid_tests timeout 120 python3 -m pytest -q -m gpu tests/test_batch_hybrid_gpu.py
             tail -1 "$OUT/batch_hybrid_tests.log" | tee -a "$summary"
             run_step batch_hybrid_force timeout 150 python3 -m specpilot verify --target "$SPECPILOT_ZOO/hybrid-tiny" \
               --drafter "$SPECPILOT_ZOO/hybrid-tiny-dflash-b16" --prompts "$SPECPILOT_ZOO/prompts/humaneval.jsonl" \
               --limit 16 --max-new-tokens 128 --device cuda --dtype bf16 --concurrency 8
             grep '^verdict' "$OUT/batch_hybrid_force.log" | tee -a "$summary"
             run_step batch_hybrid_zoo timeout 150 python3 -m specpilot bench --target "$SPECPILOT_ZOO/hybrid-tiny" \
               --drafter "$SPECPILOT_ZOO/hybrid-tiny-dflash-b16" --concurrency 1,8 --limit 16 --max-new-tokens 128 \
               --datasets "$SPECPILOT_ZOO/prompts" --benchmarks humaneval --dtype bf16 --out "$OUT/batch_hybrid_zoo"
             run_step batch_hybrid_9b timeout ${BATCH_HYBRID_S:-200} python3 -m specpilot bench --target random:qwen3.5-9b \
               --concurrency 1,8 --replay 6.49 --datasets "$SPECPILOT_DATASETS" --limit 4 --max-new-tokens 64 --dtype bf16 \
               --ablations spec --out "$OUT/batch_hybrid_9b" ;;
    # The server (specpilot serve) against the in-process batched engine at C=32, same card, one call.
    # Its client and server packages come from .whl/serve (pip download openai starlette uvicorn).
    serve)   python3 -c "import openai, starlette, uvicorn" 2>/dev/null || python3 -m pip install -q --no-index \
               --find-links .whl/serve --target /tmp/site openai starlette uvicorn
             export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
             run_step serve timeout ${SERVE_S:-400} python3 -m specpilot.bench.serve_load --target random:qwen3-8b \
               --concurrency 32 --datasets "$SPECPILOT_DATASETS" --limit ${SERVE_LIMIT:-8} --max-new-tokens 256 \
               --device cuda --dtype bf16 --out "$OUT/serve_load"
             tail -1 "$OUT/serve.log" | tee -a "$summary" ;;
    # Where a batched step's time goes (AR and spec at C = 8 and 32, Qwen3-8B shape, decode only and with a
    # newcomer's prefill chunk): wall vs device time, phases, the floor, the top ops and the host-device
    # syncs (bench/batch_profile.py).
    batch_profile) run_step batch_profile timeout ${PROFILE_S:-240} python3 -m specpilot.bench.batch_profile \
                     --preset qwen3-8b --concurrency ${PROFILE_LEVELS:-8,32} --chunks --out "$OUT/batch_profile" ;;
    # Each drafter kind's draft step against its floor, the part it adds (DFlash2 selector, DSpark Markov
    # head, PARD padding), and replayed end-to-end speedup over our AR at C=1 and 16 (Qwen3-8B shapes;
    # about 2 minutes estimated, not yet measured).
    drafters) run_step drafters timeout ${DRAFTERS_S:-240} python3 -m specpilot.bench.drafter_steps --preset qwen3-8b \
                --kinds dflash,dflash2,dspark,pard --concurrency 1,16 --out "$OUT/drafter_steps.json"
              tail -1 "$OUT/drafters.log" | tee -a "$summary" ;;
    # The hybrid target's AR / verify / commit step times against their floor (Qwen3.5-9B shape).
    hybrid)  run_step hybrid timeout 240 python3 -m specpilot.bench.hybrid_steps --preset qwen3.5-9b \
               --e2e ${HYBRID_E2E:-128} --profile "$OUT/hybrid_profile.txt" --out "$OUT/hybrid_steps.json" ;;
    # The same at issue 33's 27B-class shape (54 GB of bf16 weights: fits one 80 GB card).
    hybrid_27b) run_step hybrid_27b timeout ${HYBRID_27B_S:-200} python3 -m specpilot.bench.hybrid_steps \
               --preset qwen3.5-27b --e2e ${HYBRID_E2E:-64} --out "$OUT/hybrid_27b.json" ;;
    # The GDN recurrence kernels alone (chain and tree, snapshot write rate) and tree vs chain verify steps
    # on both scale shapes, after their GPU tests.
    gdn_trees) run_step gdn_tests timeout 200 python3 -m pytest -q -m gpu tests/test_gdn_gpu.py tests/test_gdn_tree_gpu.py \
                 tests/test_tree_build_gpu.py tests/test_tree_gpu.py tests/test_tree_graphs_gpu.py tests/test_hybrid_graphs_gpu.py
               tail -1 "$OUT/gdn_tests.log" | tee -a "$summary"
               run_step gdn_kernels timeout 100 python3 -m specpilot.bench.gdn_kernels --out "$OUT/gdn_kernels.json"
               for preset in qwen3.5-9b qwen3-8b; do
                 run_step tree_$preset timeout 120 python3 -m specpilot.bench.tree_steps --preset $preset \
                   --nodes 16,32,64 --out "$OUT/tree_steps_$preset.json"
               done ;;
    # The embedded pair (python/specpilot/data/pair) retrained on this GPU (scripts/embedded_pair/build.sh,
    # PAIR_PCT percent of its CPU stage budgets), packed as $OUT/pair.tgz; needs the zoo target + recipe.
    # (the stages' own outputs travel too, for a run cut short by its timeout)
    embedded_pair) run_step embedded_pair env DEVICE=cuda TIME_PCT=${PAIR_PCT:-10} TARGET_BATCH=128 DRAFT_BATCH=128 \
                     PY=python3 ZOO=$SPECPILOT_ZOO WORK=/tmp/pair DEST=/tmp/pair_dest timeout ${PAIR_S:-500} \
                     bash scripts/embedded_pair/build.sh
                   tar czf "$OUT/pair.tgz" -C /tmp $(cd /tmp && ls -d pair_dest pair/target pair/drafter* pair/measure.json 2>/dev/null)
                   tail -3 "$OUT/embedded_pair.log" | tee -a "$summary" ;;
    # Issue 33: transformers' greedy AR on the Qwen3.5-9B shape (its hybrid cache, fla's kernels from
    # .whl/fla) beside our AR and spec (tau 6.49 replayed), one process, random weights written to disk.
    hybrid_hf) with_fla; H9=/tmp/specpilot_h9b
               [ -f "$H9/target/config.json" ] || run_step write_h9b python3 -m specpilot.bench.random_checkpoint \
                 --preset qwen3.5-9b --out "$H9" --device cuda
               run_step hybrid_hf timeout ${HYBRID_HF_S:-300} python3 -m specpilot bench --target $H9/target --drafter $H9/drafter \
                 --methods hf_static,our_ar,our_spec --replay 6.49 --datasets "$SPECPILOT_DATASETS" --benchmarks humaneval \
                 --limit 2 --max-new-tokens 128 --dtype bf16 --out "$OUT/hybrid_hf" ;;
    # Our GDN chain kernel against fla's Triton kernel, one layer at the Qwen3.5-9B shape (fla-core and
    # einops from .whl/fla: pip download --no-deps fla-core einops).
    gdn_fla) with_fla
             run_step gdn_fla timeout 200 python3 -m specpilot.bench.gdn_fla --out "$OUT/gdn_fla.jsonl" ;;
    # The paged decode attention kernel against the batched engine's gather + SDPA, one layer (fp64-checked).
    paged)   run_step paged timeout 200 python3 -m specpilot.bench.paged_attention_kernels --out "$OUT/paged_attention.jsonl" ;;
    # Real-tier trees on each zoo pair carried (issue 34): tau per tree budget (fp32, the same prompts),
    # then bf16 generations per budget (tau and tokens/s; 0 is chain) and the tree verdict.
    trees_real) for pair in code-tiny hybrid-tiny; do
                  [ -d "${SPECPILOT_ZOO:-}/$pair" ] || continue
                  Z=$SPECPILOT_ZOO; P=$Z/prompts/pystdlib.jsonl
                  run_step tree_tau_$pair timeout ${TREE_TAU_S:-120} python3 -m specpilot.bench.tree_tau --target $Z/$pair \
                    --drafter $Z/$pair-dflash-b16 --prompts $P --limit ${TREE_LIMIT:-48} --budgets 0,8,16,32 --device cuda \
                    --dtype fp32 --out "$OUT/tree_tau_$pair.json"
                  for b in 0 16 32; do
                    run_step tree_gen_${pair}_$b timeout ${TREE_GEN_S:-90} python3 -m specpilot generate --target $Z/$pair \
                      --drafter $Z/$pair-dflash-b16 --prompts $P --limit ${TREE_LIMIT:-48} --max-new-tokens 256 --device cuda \
                      --dtype bf16 --tree-budget $b
                    tail -1 "$OUT/tree_gen_${pair}_$b.log" | tee -a "$summary"
                  done
                  run_step tree_verify_$pair timeout ${TREE_VERIFY_S:-90} python3 -m specpilot verify --target $Z/$pair \
                    --drafter $Z/$pair-dflash-b16 --prompts $P --limit 16 --max-new-tokens 128 --device cuda --dtype bf16 \
                    --tree-budget 32
                  grep '^verdict' "$OUT/tree_verify_$pair.log" | tee -a "$summary"
                done ;;
    # Prefix-first (issue 36, C2) beside one-pass verify at C = 32, scale tier, a replayed tau that never
    # runs pass 2 (3.1) and one that always does (6.49); then the zoo pair's real acceptance.
    prefix_first) for tau in 3.1 6.49; do
                    run_step prefix_first_tau$tau timeout ${PREFIX_S:-90} python3 -m specpilot bench --target random:qwen3-8b \
                      --concurrency ${PREFIX_LEVELS:-32} --replay $tau --datasets "$SPECPILOT_DATASETS" --benchmarks gsm8k,humaneval \
                      --limit 32 --max-new-tokens 128 --dtype bf16 --two-level prefix-first --verify-prefix 4 \
                      --out "$OUT/prefix_first_tau$tau"
                  done
                  [ -d "${SPECPILOT_ZOO:-}/code-tiny" ] && run_step prefix_first_zoo timeout ${PREFIX_S:-90} python3 -m specpilot bench \
                    --target $SPECPILOT_ZOO/code-tiny --drafter $SPECPILOT_ZOO/code-tiny-dflash-b16 --concurrency 8,32 \
                    --datasets $SPECPILOT_ZOO/prompts --benchmarks humaneval,pystdlib --limit 16 --max-new-tokens 128 --dtype bf16 \
                    --two-level prefix-first --verify-prefix 4 --out "$OUT/prefix_first_zoo" ;;
    # The reduced draft vocabulary (issue 36): tau per size on the zoo pair (real tier, bf16), the draft
    # and verify step per size on the Qwen3-8B shape (scale tier).
    draft_vocab) Z=${SPECPILOT_ZOO:-}
                 if [ -d "$Z/code-tiny" ]; then
                   run_step draft_vocab_rank timeout 90 python3 -m specpilot draft-vocab --target $Z/code-tiny \
                     --prompts $Z/prompts/humaneval.jsonl --prompts $Z/prompts/pystdlib.jsonl --skip 40 --greedy-tokens 64 \
                     --out "$OUT/rank.json" --device cuda
                   run_step draft_vocab_tau timeout 150 python3 -m specpilot.bench.draft_vocab_tau --target $Z/code-tiny \
                     --drafter $Z/code-tiny-dflash-b16 --ranking "$OUT/rank.json" --prompts $Z/prompts/humaneval.jsonl \
                     --prompts $Z/prompts/pystdlib.jsonl --limit 20 --sizes 0,512,1024,2048,4096 --max-new-tokens 256 \
                     --device cuda --dtype bf16
                 fi
                 run_step draft_vocab_scale timeout 120 python3 -m specpilot.bench.draft_vocab_scale --preset qwen3-8b \
                   --sizes 0,8192,16384,32768,65536 --device cuda ;;
    # Issue 38's GPU demonstration (docs/agents.md): mechanism searches from the de-tuned start on the
    # Qwen3-8B shape at C = 1 and C = 16 (cold), then the LLaMA-3.1-8B shape at C = 1 from memory and cold;
    # each search stops after AGENTS_SEARCH_S seconds (the issue allows 600).
    agents_demo) R8=${SCALE_DIR:-/tmp/specpilot_r8b}; L8=/tmp/specpilot_l8b; MEM=$OUT/agents_mech.sqlite
                 [ -f "$R8/target/config.json" ] || run_step write_8b python3 -m specpilot.bench.random_checkpoint \
                   --preset qwen3-8b --out "$R8" --device cuda
                 [ -f "$L8/target/config.json" ] || run_step write_l8b python3 -m specpilot.bench.random_checkpoint \
                   --preset llama-3.1-8b --out "$L8" --device cuda
                 S=${AGENTS_SEARCH_S:-480}
                 common=(--search mechanisms --evaluator engine --drafter-kind dflash-b16 --weights split12 --replay 6.49
                         --max-new-tokens 128 --repeats 2 --budget 30 --time-budget $S --start detuned --device cuda)
                 for run in qwen_c1 qwen_c16 llama_c1_memory llama_c1_cold; do
                   case $run in
                     qwen_c1)  args=(--target $R8/target --drafter $R8/drafter --target-shape qwen3-8b --concurrency 1 --prompts 2 --cold --memory $MEM) ;;
                     qwen_c16) args=(--target $R8/target --drafter $R8/drafter --target-shape qwen3-8b --concurrency 16 --prompts 16 --cold --memory $MEM) ;;
                     llama_c1_memory) args=(--target $L8/target --drafter $L8/drafter --target-shape llama-3.1-8b --concurrency 1 --prompts 2 --memory $MEM) ;;
                     llama_c1_cold) args=(--target $L8/target --drafter $L8/drafter --target-shape llama-3.1-8b --concurrency 1 --prompts 2 --cold --memory $OUT/llama_cold.sqlite) ;;
                   esac
                   run_step agents_$run timeout $((S + 120)) python3 -m specpilot optimize "${common[@]}" "${args[@]}"
                   tail -1 "$OUT/agents_$run.log" | cut -c1-400 | tee -a "$summary"
                 done
                 python3 -m specpilot memory export "$OUT/agents_mech.json" --memory $MEM > /dev/null ;;
    # docs/results.md's form of whatever of the engine and bench steps ran in this $OUT.
    results) runs=(); for r in engine.jsonl bench_zoo bench_8b hf_8b five_8b; do [ -e "$OUT/$r" ] && runs+=("$OUT/$r"); done
             if [ ${#runs[@]} -gt 0 ]; then
               run_step results python3 -m specpilot.bench.results_page "${runs[@]}" --out "$OUT/results.md"
             fi ;;
    *)       echo "unknown step $step"; exit 2 ;;
  esac
done

echo
echo "== tables"
for name in trees split12 gemv skinny engine ab defaults_ab agents bench_zoo bench_hybrid_zoo bench_8b hf_8b five_8b batch_scale batch_zoo batch_hybrid_zoo batch_hybrid_9b hybrid_hf gdn_fla prefix_first_tau3.1 prefix_first_tau6.49 prefix_first_zoo; do
  [ -f "$OUT/$name.log" ] && { echo "-- $name"; grep -E '^\|' "$OUT/$name.log" | tail -25; }
done
for name in cost_bf16 cost_split12; do
  [ -f "$OUT/$name.log" ] && { echo "-- $name"; grep -E '^# (steps|every)' "$OUT/$name.log"; }
done
echo "== summary"
cat "$summary"
