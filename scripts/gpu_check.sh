#!/usr/bin/env bash
# Everything that needs a GPU, in one call on the device machine (see docs/benchmarks.md).
#   Usage: scripts/gpu_check.sh [PART[@GPUS] ...]     default: tests demo bench soak
#   PART: throughput (the batch with the memfd, the device buffer, and shared stages: THROUGHPUT_VARIANTS), ray (the batch through the local backend and the Ray service; see the part), multi, refcopy and ranks (two GPUs: the
#   multi-GPU issue), tests (GPU-marked pytest), times (eager ms of the built-in problems at GPU size), wire (a 1 GB-output evaluation profiled), digest (device digest: self-check, runner, cost), digestwarm (where a spare's digest phase goes), oomturns (jobs out of memory side by side, run again alone), stage (one evaluation's stages and timing record, STAGE_PROBLEMS), shim (the launch shim on bare CUDA 13 stubs), solutions (our reference solutions timed at GPU size), envelope (spare vs own-runner calibration), clock (another process's GPU time from a probe context's time-slice gaps: round 4's clock design), probewall (the probe check's wall reading on honest candidates, per window), probecost (the fidelity cases without and with the probe check: its cost per evaluation), payload (pipe vs memfd per call), devpayload (outputs through the judge's device buffer: its GPU tests, then the batch without and with it), adversarial (tests/adversarial against a CUDA judge and runners on cuda:0; ADVERSARIAL_GROUP, below), batch (kb-gym bench --batch), demo, bench (kb-gym bench), soak (kb-gym soak), audit (kb-gym audit on
#   the official set). PART@GPUS pins a part to those GPUs (CUDA_VISIBLE_DEVICES) and runs it beside the
#   others, e.g. `tests+demo@0 audit@1` on a two-GPU machine (a+b: a then b); parts without @ run one after
#   another.
#   Knobs: TIMES_DATASET (e.g. synthetic:200), TIMES_ONLY (problem keys), TIMES_TAG (suffix of times.json), SOLUTIONS_ONLY (problem keys, comma-separated), FIDELITY_REPEATS, FIDELITY_PRESETS (e.g. default,rl), KB_GYM_FIDELITY_CASES, KB_GYM_FIDELITY_BURST (1: with the burst check), SOAK_N, SOAK_MINUTES, SOAK_DEVICE, AUDIT_DATASET, AUDIT_LEVEL, AUDIT_TRIALS, AUDIT_DEVICE, AUDIT_SECONDS,
#   AUDIT_RETRY_SECONDS, GPU_TESTS (what the tests part collects, e.g. tests/gpu/test_gpu_wall_check.py), PYTEST_ARGS, ADVERSARIAL_GROUP (a number, or several: "3 4 5 6" side by side), ADVERSARIAL_ONLY, BATCH_ARGS (e.g. --no-kernelbench-way), MEMORY_SAMPLES (seconds: GPU memory by process), KB_GYM_MEMORY_HISTORY (a
#   folder: the judges' allocations with their stacks at each stage's mark; scripts/memory_peak.py FOLDER names
#   what each stage's peak held);
#   GPU workers are Landlocked by default (KB_GYM_LANDLOCK=auto; unconfined where CUDA fails under it);
#   KB_GYM_LANDLOCK=try runs the probe first and sets 1 or 0 from it.
# Expects, carried beside the working tree: .whl/ (gymnasium, trl, datasets wheels from
# ../shared/tools/device-wheels) and .device/kernelbench/ (the official level_N.jsonl files). An audit
# resumes from .device/audit-SET.jsonl when one was carried (a copy of an earlier run's $OUT/audit-SET.jsonl).
# `python3 -P`: the repository root holds a kb_gym/ folder that would shadow the installed package.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/kb_gym_out}; mkdir -p "$OUT"
SITE=/tmp/kb_site
rm -rf "$SITE"  # a warm machine keeps the last install; pip --target would not replace it
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" . || exit 1
export PYTHONPATH=$SITE KB_GYM_DATASET=$PWD/.device/kernelbench KB_GYM_CACHE=/tmp/kb_gym_cache
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -P -c "from kb_gym.worker.landlock import abi_version; print('landlock ABI', abi_version())"
if [ "${KB_GYM_LANDLOCK:-}" = try ]; then  # confine GPU workers if CUDA runs under their ruleset here
  if python3 -P scripts/gpu_landlock_probe.py --worker-ruleset; then export KB_GYM_LANDLOCK=1
  else export KB_GYM_LANDLOCK=0; fi
  echo "KB_GYM_LANDLOCK=$KB_GYM_LANDLOCK"
fi
kb() { python3 -P -m kb_gym.cli "$@"; }

# The adversarial part: every file of tests/adversarial whose verdicts depend on the judge's device (device.py reads
# KB_GYM_ADVERSARIAL_DEVICE; left out, as they decide nothing on a device: test_static_*.py and rounds 10, 11 and 23,
# static checks, fresh interpreters and the layers above the Evaluator). More than a command's 600 s and than a
# session's 30 device minutes, so it runs in groups, one call each (ADVERSARIAL_GROUP=1 ... 10; unset: all in one
# command). On the H200 (session 31) the first 59 tests of the old group 1 (judge isolation, rounds 2-4, two of
# round 5) took ~520 s, 1.4x the estimate from the 2-core CPU's durations times 2.7; the groups are now half that
# size, ~5 minutes each by the corrected estimate. pytest gets SIGINT at ADVERSARIAL_SECONDS (default 540; none for the
# whole suite), so a group cut short still prints its summary and failures.
A=tests/adversarial
ADVERSARIAL_GROUPS=(
  "$A/test_judge_isolation.py $A/test_redteam_round2.py $A/test_redteam_round3.py"
  "$A/test_redteam_round4.py $A/test_redteam_round5.py $A/test_spot_check.py $A/test_device_digest_path.py"
  "$A/test_redteam_round6.py $A/test_redteam_round7.py $A/test_redteam_round8.py"
  "$A/test_redteam_round9.py $A/test_redteam_round12.py $A/test_redteam_round13.py"
  "$A/test_redteam_round14.py $A/test_redteam_round15.py $A/test_redteam_round16.py $A/test_redteam_round17.py"
  "$A/test_redteam_round18.py $A/test_redteam_round19.py $A/test_redteam_round20.py $A/test_redteam_round21.py"
  "$A/test_redteam_round22.py $A/test_shared_payload.py"
  "$A/test_scratch_disk.py $A/test_runtime_checks.py"
  "tests/gpu/test_gpu_neighbour_queue.py $A/test_neighbour_pause.py $A/test_faults.py $A/test_audit.py"
  "$A/test_soak.py $A/test_redteam_round28.py $A/test_redteam_round33.py $A/test_redteam_round35.py"
)

# Several groups at once (ADVERSARIAL_GROUP="3 4 5 6": one pytest each, side by side on the one GPU, each its own log
# $OUT/adversarial-gN.log): ten groups at ~5 minutes each are more than a session's 30 device minutes one by one.
# Their Evaluators take turns on the GPU through the host's device lock (gpu_sharing="wait"), so no two timings
# overlap; what runs beside a timing is another group's loading candidate or starting spare, the neighbour exposure
# of docs/integrity.md (Open), which a batch with two workers per device has too. A test that fails here is run
# again alone (ADVERSARIAL_ONLY) before it is read as a verdict.
adversarial_parallel() {
  local g pids=() status=0
  for g in $ADVERSARIAL_GROUP; do
    if ! [[ "$g" =~ ^[1-9][0-9]?$ ]] || [ "$g" -gt ${#ADVERSARIAL_GROUPS[@]} ]; then
      echo "ADVERSARIAL_GROUP: numbers 1 to ${#ADVERSARIAL_GROUPS[@]}"; return 2; fi
  done
  for g in $ADVERSARIAL_GROUP; do
    KB_GYM_ADVERSARIAL_DEVICE=cuda:0 timeout -s INT "${ADVERSARIAL_SECONDS:-540}" \
      python3 -P -m pytest -q -p no:cacheprovider -rfE --tb=short --durations=10 \
      ${ADVERSARIAL_GROUPS[$((g - 1))]} > "$OUT/adversarial-g$g.log" 2>&1 &
    pids+=($!)
  done
  for g in $ADVERSARIAL_GROUP; do wait "${pids[0]}" || status=1; pids=("${pids[@]:1}")
    echo "== group $g: $(grep -E '(passed|failed|error)' "$OUT/adversarial-g$g.log" | tail -1)"
    grep -E "^(FAILED|ERROR) " "$OUT/adversarial-g$g.log" | head -20
  done
  return $status
}

part() {  # part NAME: runs one part, output in $OUT/NAME.log; returns its status
  case $1 in
    # eval: PYTEST_ARGS may hold quoted words, e.g. -k "not load_inline and not two_workers"
    # GPU_TESTS: the files or folders to collect (default: tests); PYTEST_ARGS is added to them, not instead of them
    tests) eval "python3 -P -m pytest -q -p no:cacheprovider --durations=12 -m gpu ${GPU_TESTS:-tests} ${PYTEST_ARGS:-}" ;;
    # The adversarial suite (CPU in CI) against a GPU judge and GPU runners: ADVERSARIAL_GROUPS (above), or the
    # group ADVERSARIAL_GROUP names; ADVERSARIAL_ONLY (test files or pytest arguments, space-separated) instead.
    adversarial) if [[ "${ADVERSARIAL_GROUP:-}" == *" "* ]]; then adversarial_parallel; return; fi
                 if [ -z "${ADVERSARIAL_GROUP:-}" ]; then adv="${ADVERSARIAL_GROUPS[*]}"
                 elif [[ "$ADVERSARIAL_GROUP" =~ ^[1-9][0-9]?$ ]] && [ "$ADVERSARIAL_GROUP" -le ${#ADVERSARIAL_GROUPS[@]} ]; then
                   adv=${ADVERSARIAL_GROUPS[$((ADVERSARIAL_GROUP - 1))]}
                 else echo "ADVERSARIAL_GROUP: 1 to ${#ADVERSARIAL_GROUPS[@]}"; return 2; fi
                 limit=${ADVERSARIAL_SECONDS:-540}; [ -z "${ADVERSARIAL_GROUP:-}${ADVERSARIAL_ONLY:-}" ] && limit=0  # 0: none
                 KB_GYM_ADVERSARIAL_DEVICE=cuda:0 timeout -s INT "$limit" \
                   python3 -P -m pytest -q -p no:cacheprovider -rfE --tb=short --durations=15 \
                   ${ADVERSARIAL_ONLY:-$adv} ;;
    demo) kb demo ;;
    probe) python3 -P scripts/gpu_landlock_probe.py ;;
    bench) kb bench --out "$OUT/bench.json" ;;
    batch) kb bench --batch ${BATCH_ARGS:-} --out "$OUT/batch.json" ;;
    # Outputs through the judge's device buffer (worker/device_payload.py, off by default until this has run): its
    # GPU tests, then the batch without and with it, in one call on one machine.
    devpayload) python3 -P -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu \
                  tests/gpu/test_gpu_device_payload.py tests/test_wire.py || return 1
                kb bench --batch --no-kernelbench-way --workers-per-device 2 --out "$OUT/batch-memfd.json" && \
                KB_GYM_DEVICE_PAYLOAD=1 kb bench --batch --no-kernelbench-way --workers-per-device 2 \
                  --out "$OUT/batch-device.json" ;;
    # The throughput settings side by side, one call, one machine, builds warmed before each clock: THROUGHPUT_VARIANTS
    # (default "memfd device shared"): memfd = the defaults; device = outputs through the judge's device buffer
    # (KB_GYM_DEVICE_PAYLOAD=1); shared = that and correctness/kernel checks holding the device shared
    # (KB_GYM_SHARED_STAGES=1, device_lock.py); notriton = the defaults without Triton's kept kernels and judge-built
    # launchers (both on by default on a GPU since session 44); triton = the defaults, named as such (its row before
    # session 44); expandable = the defaults with the judges' caching allocator growing segments in place
    # (PYTORCH_CUDA_ALLOC_CONF, which judges inherit and runners do not); loadforward = the defaults with one forward
    # at the end of each load, outside the lock (KB_GYM_LOAD_FORWARD=1, load_forward.py). Each batch's rows print its memfd and
    # device-buffer calls.
    throughput) for v in ${THROUGHPUT_VARIANTS:-memfd device shared}; do
                  case $v in memfd) envs="";; device) envs="KB_GYM_DEVICE_PAYLOAD=1";;
                             shared) envs="KB_GYM_DEVICE_PAYLOAD=1 KB_GYM_SHARED_STAGES=1";;
                             triton) envs="KB_GYM_TRITON_CACHE=1 KB_GYM_TRITON_LAUNCHERS=1";;
                             notriton) envs="KB_GYM_TRITON_CACHE=0 KB_GYM_TRITON_LAUNCHERS=0";;
                             expandable) envs="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";;
                             loadforward) envs="KB_GYM_LOAD_FORWARD=1";;
                             *) echo "THROUGHPUT_VARIANTS: memfd, device, shared, triton, notriton, expandable, loadforward"
                                return 2;; esac
                  echo "== throughput variant $v ($envs)"
                  env $envs python3 -P -m kb_gym.cli bench --batch --no-kernelbench-way --warm-builds \
                    --workers-per-device 2 ${BATCH_ARGS:-} --out "$OUT/batch-$v.json" || return 1
                done ;;
    fidelity) kb bench --fidelity --repeats "${FIDELITY_REPEATS:-2}" --presets "${FIDELITY_PRESETS:-default}" \
                --out "$OUT/fidelity.json" ;;
    smoke) python3 -P scripts/gpu_smoke.py ;;
    shim) python3 -P scripts/gpu_shim_diag.py ;;
    stage) python3 -P scripts/gpu_stage_diag.py ${STAGE_PROBLEMS:-} ;;
    times) python3 -P scripts/problem_times.py --dataset "${TIMES_DATASET:-builtin}" --size gpu --measure \
             ${TIMES_ONLY:+--only "$TIMES_ONLY"} --out "$OUT/times${TIMES_TAG:-}.json" ;;
    diag) python3 -P scripts/gpu_timing_diag.py ;;
    wire) python3 -P scripts/gpu_wire_profile.py ;;
    envelope) python3 -P scripts/gpu_envelope_diag.py ;;
    clock) python3 -P scripts/gpu_probe_clock.py --out "$OUT/clock.json" ;;
    # The probe check's wall reading on honest candidates, per window (it charged an honest ReLU: benchmarks.md 0y)
    probewall) python3 -P scripts/gpu_probe_wall.py --out "$OUT/probe-wall.json" ;;
    # The probe check's cost on one machine: the fidelity cases without it, then with it (FIDELITY_REPEATS, default
    # 2: a problem's first pass and one reusing its spare calls), then the per-evaluation walls side by side.
    # The off run sets KB_GYM_PROBE_CHECK=0 itself: a call that set it for its tests part (session 36) ran both on.
    probecost) KB_GYM_PROBE_CHECK=0 kb bench --fidelity --repeats "${FIDELITY_REPEATS:-2}" \
                 --out "$OUT/fidelity-probe-off.json" && \
               KB_GYM_PROBE_CHECK=1 kb bench --fidelity --repeats "${FIDELITY_REPEATS:-2}" \
                 --out "$OUT/fidelity-probe-on.json" && \
               python3 -P scripts/probe_cost.py "$OUT/fidelity-probe-off.json" "$OUT/fidelity-probe-on.json" ;;
    digest) python3 -P scripts/gpu_digest_diag.py ;;
    # Where a spare's 0.6 s "digest" start-up phase goes: the kernel from a filled cache, with and without Triton's
    # cache key computed first (as the zygote does before its forks), one run profiled
    digestwarm) python3 -P scripts/digest_warm_profile.py ;;
    # Jobs out of the device's memory side by side, run again alone (device_turns.py): OOM_PROBLEM (an official key)
    oomturns) python3 -P scripts/gpu_oom_turns.py "${OOM_PROBLEM:-level1/23_Softmax}" ;;
    solutions) python3 -P scripts/solution_speedups.py --size gpu ${SOLUTIONS_ONLY:+--only "$SOLUTIONS_ONLY"} \
                 --out "$OUT/solutions.json" ;;
    payload) python3 -P scripts/payload_bench.py --mb 2048 && python3 -P scripts/payload_bench.py --mb 64 ;;
    soak) kb soak -n "${SOAK_N:-1000}" --max-minutes "${SOAK_MINUTES:-8}" --device "${SOAK_DEVICE:-auto}" \
            --out "$OUT/soak.json" ;;
    # AUDIT_DATASET may list several sets (builtin,synthetic): one audit each, rows in $OUT/audit-SET.jsonl,
    # resumed from .device/audit-SET.jsonl when an earlier run's file was carried there.
    audit) for ds in $(echo "${AUDIT_DATASET:-official}" | tr ',' ' '); do
             rows="$OUT/audit-${ds//[^a-z0-9]/-}.jsonl"
             [ -f ".device/$(basename "$rows")" ] && cp ".device/$(basename "$rows")" "$rows"
             audit() { timeout "$1" python3 -P -m kb_gym.cli audit --dataset "$ds" ${AUDIT_LEVEL:+--level "$AUDIT_LEVEL"} \
               --trials "${AUDIT_TRIALS:-3}" --device "$2" --out "$rows"; }
             # Then the problems that ran out of memory beside another worker, again with one worker.
             audit "${AUDIT_SECONDS:-540}" "${AUDIT_DEVICE:-auto}"; audit "${AUDIT_RETRY_SECONDS:-120}" cuda:0
           done ;;
    # Ray in one call: .carry/ray/ holds a slim Ray wheel (scripts/ray_wheel_slim.py: 39 MB, fits beside the
    # rest) and the dependencies the image lacks (jsonschema, referencing, rpds-py, jsonschema-specifications).
    # Runs the batch through the local backend and through the Ray service (BATCH_ARGS, e.g. --no-kernelbench-way).
    ray) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kb_ray_site .carry/ray/*.whl \
           || return 1
         export PYTHONPATH=$SITE:/tmp/kb_ray_site
         python3 -c "import ray; print('ray', ray.__version__)" || return 1
         # One fresh cache folder for both: the CUDA candidates are built once, before the local run's clock starts
         # (--warm-builds), so neither wall holds nvcc or its variation; the default preset times every baseline
         # beside its candidate, so nothing else cached passes from one run to the other. Never the KernelBench
         # way here (the batch part's). From /tmp: Ray puts the driver's working directory on its workers'
         # sys.path, and the repository root's kb_gym/ would shadow the installed one.
         rm -rf /tmp/kb_gym_cache_cmp
         (cd /tmp && export KB_GYM_CACHE=/tmp/kb_gym_cache_cmp && \
          kb bench --batch --no-kernelbench-way --warm-builds ${BATCH_ARGS:-} --out "$OUT/batch-local.json" && \
          kb bench --batch --no-kernelbench-way --warm-builds --backend ray \
            ${BATCH_ARGS:-} --out "$OUT/batch-ray.json") ;;
    # The multi-GPU issue (needs two GPUs; nvidia-h200-x2): the batch on one GPU and on two (local), then on two
    # through Ray; one cache folder, builds warmed before any clock, from /tmp as in the ray part.
    multi) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kb_ray_site .carry/ray/*.whl \
             || return 1
           export PYTHONPATH=$SITE:/tmp/kb_ray_site
           rm -rf /tmp/kb_gym_cache_multi
           (cd /tmp && export KB_GYM_CACHE=/tmp/kb_gym_cache_multi && \
            kb bench --batch --no-kernelbench-way --warm-builds --device cuda:0 --out "$OUT/batch-1gpu.json" && \
            kb bench --batch --no-kernelbench-way --warm-builds --device cuda --out "$OUT/batch-2gpu.json" && \
            kb bench --batch --no-kernelbench-way --warm-builds --device cuda --backend ray \
              --out "$OUT/batch-ray-2gpu.json") ;;
    # Reference-as-candidate on REFCOPY_PROBLEMS official problems on every GPU at once (one Evaluator each):
    # speedups in [0.98, 1.02], baselines within 2% across GPUs, and from the results no two timings on one GPU.
    refcopy) python3 -P scripts/refcopy_devices.py --devices cuda --problems "${REFCOPY_PROBLEMS:-16}" \
               --out "$OUT/refcopy" && kb timeline "$OUT"/refcopy/results-*.jsonl ;;
    # The multi-GPU issue's training layout (two GPUs): the policy on GPU 0, the Ray service on GPU 1, two trainer
    # processes sharing it; the step split per rank and the service's timeline (scripts/ranks_share.sh).
    ranks) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kb_ray_site .carry/ray/*.whl \
             || return 1
           PYTHONPATH=$SITE:/tmp/kb_ray_site bash scripts/ranks_share.sh ;;
    *) echo "unknown part $1"; return 2 ;;
  esac
}

# MEMORY_SAMPLES=S: who holds the GPU's memory, sampled every S seconds through the parts (scripts/gpu_memory_sampler.py;
# $OUT/memory.jsonl, its summary last)
if [ -n "${MEMORY_SAMPLES:-}" ]; then
  python3 -P scripts/gpu_memory_sampler.py "$OUT/memory.jsonl" --every "$MEMORY_SAMPLES" & sampler=$!
fi
rc=0
pids=()
for spec in "${@:-tests demo bench soak}"; do
  for item in $spec; do
    names=${item%@*}
    if [ "$item" != "$names" ]; then
      (export CUDA_VISIBLE_DEVICES=${item#*@}; s=0
       for name in ${names//+/ }; do part "$name" >"$OUT/$name.log" 2>&1 || s=1; done; exit $s) &
      pids+=($!)
    else
      for name in ${names//+/ }; do
        part "$name" 2>&1 | tee "$OUT/$name.log"
        [ "${PIPESTATUS[0]}" = 0 ] || rc=1
      done
    fi
  done
done
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
if [ -n "${sampler:-}" ]; then kill -TERM "$sampler"; wait "$sampler"; fi

echo "== summary =="
grep -E "passed|failed" "$OUT/tests.log" "$OUT/adversarial.log" 2>/dev/null | tail -2
grep -E "FAILED|Error" "$OUT/tests.log" 2>/dev/null | head -20
cat "$OUT/probe.log" 2>/dev/null
grep -E "^[12]\. |^shim library" "$OUT/shim.log" 2>/dev/null
tail -n 12 "$OUT/bench.log" 2>/dev/null
tail -n 30 "$OUT/smoke.log" 2>/dev/null
tail -n 6 "$OUT/diag.log" 2>/dev/null
head -n 3 "$OUT/wire.log" 2>/dev/null
cat "$OUT/envelope.log" 2>/dev/null
grep -E "^[1-4]\." "$OUT/digest.log" 2>/dev/null
cat "$OUT/payload.log" 2>/dev/null
cat "$OUT/probewall.log" 2>/dev/null
tail -n 10 "$OUT/fidelity.log" 2>/dev/null
tail -n 14 "$OUT/batch.log" 2>/dev/null
grep -E "^Evaluator:|passed|failed" "$OUT/devpayload.log" 2>/dev/null
grep -E "wall|per GPU-hour|busy" "$OUT/ray.log" 2>/dev/null | tail -8
grep -E "^Evaluator:" "$OUT/multi.log" 2>/dev/null
tail -n 8 "$OUT/refcopy.log" 2>/dev/null
tail -n 12 "$OUT/times.log" 2>/dev/null
tail -n 9 "$OUT/soak.log" 2>/dev/null
for f in "$OUT"/audit-*.jsonl; do [ -f "$f" ] && echo "$(basename "$f") rows: $(wc -l <"$f")"; done
[ -f "$OUT/memory.jsonl" ] && python3 -P scripts/gpu_memory_sampler.py --summary "$OUT/memory.jsonl"
[ -f "$OUT/audit.log" ] && grep -a -E "problems; passed|passed by|reference inexact|the control" \
  "$OUT/audit.log" | tail -45
exit $rc
