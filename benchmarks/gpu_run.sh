#!/usr/bin/env bash
# One device-tool call on an H200: GPU tests, the line profile, news5 end to end, the int4 kernel table,
# the memory table (and its phases), the server under load. Pick with STAGES="files tests profile codec decode_batch roofline units text concurrency concurrency2 concurrency_base host_profile cpu_preset news5 news5_batch int4 memory memory_phases memory_budget server_load many_speakers caches" (and the *_S timeouts, *_ARGS).
#
#   run(command="bash benchmarks/gpu_run.sh", carry=[".whl"])
#
# Test data and the news5 set are in the repository; .whl holds the cp312 wheels the image lacks,
# made by `bash benchmarks/device_wheels.sh [base] [server]` (its header lists them: every stage
# needs base, server_load and many_speakers server; py-spy for SERVER_LOAD_ARGS="--full int4
# --gil-profile $OUT/gil.txt"); optionally onecomp-runtime (the seed's int4 kernel, for
# int4_gpu.py's comparison column; the device README's pip download line). Logs land in
# $OUT/logs.tar (see pack below).
#
# Stage concurrency_base runs the older tree's concurrency.py (CONC_BASE_ARGS) after this tree's.
# Stage news5_base runs news5 of an older tree in .device_base (src/ and benchmarks/ of a commit, made
# with: rm -rf .device_base && mkdir .device_base && git archive COMMIT src benchmarks | tar -x -C
# .device_base; carry it too) right after news5 of this tree, on the same machine and the same random
# files: the side-by-side "not slower" check, e.g. STAGES="news5 news5_base". The older tree reads
# its manifests from its own tests/data: the stage copies this tree's in when the archive lacks them.
set -uo pipefail
export PYTHONUNBUFFERED=1 IRODORI_CACHE=/tmp/irodori-cache
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD/src:/tmp/site" PATH="/tmp/site/bin:$PATH"  # bin: py-spy (--gil-profile)
else
  export PYTHONPATH="$PWD/src"
fi
# what a fresh machine's first process builds for minutes, from an earlier call's `caches` stage
# (its $OUT/device_caches.tgz saved here as .device_caches/device_caches.tgz and carried): the int4
# chooser's timings (the tune file) and Triton's compiled kernels
TRITON_DIR="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
if [ -f .device_caches/device_caches.tgz ]; then
  rm -rf /tmp/caches_in && mkdir -p /tmp/caches_in "$IRODORI_CACHE" "$TRITON_DIR"
  tar -xzf .device_caches/device_caches.tgz -C /tmp/caches_in
  [ -d /tmp/caches_in/kernels ] && cp -r /tmp/caches_in/kernels "$IRODORI_CACHE/"
  [ -d /tmp/caches_in/triton ] && cp -r /tmp/caches_in/triton/. "$TRITON_DIR/"
  echo "caches restored: $(du -sh /tmp/caches_in | cut -f1)"
fi
STAGES="${STAGES:-env tests profile news5 int4 memory}"
TESTS="${TESTS:-tests/engine/test_batch.py tests/engine/test_codec_fast.py tests/engine/test_fast.py tests/engine/test_fast_v4.py tests/engine/test_fused.py tests/engine/test_codec_graphs.py tests/backends/test_cuda_backend.py tests/quant/test_cuda.py tests/quant/test_fp8.py tests/engine/test_memory_budget_cuda.py tests/test_device_owner.py tests/test_text_batching.py}"

# The device returns at most 8 files a call: as each stage starts, and at the end, what the stages
# before it wrote moves into $OUT/logs.tar (`tar -xf logs.tar` where the call's files land), so a
# call may run every stage it fits in time; the caches archive stays a file of its own.
pack() {
  local f files=()
  while IFS= read -r -d '' f; do files+=("${f#"$OUT"/}"); done \
    < <(find "$OUT" -mindepth 1 -type f ! -name logs.tar ! -name '*.tgz' -print0)
  [ ${#files[@]} -eq 0 ] && return 0
  tar -rf "$OUT/logs.tar" -C "$OUT" "${files[@]}" && (cd "$OUT" && rm -f "${files[@]}")
  find "$OUT" -mindepth 1 -type d -empty -delete
}
trap pack EXIT
stage() { case " $STAGES " in *" $1 "*) pack; return 0 ;; *) return 1 ;; esac; }

if stage env; then
  { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    nproc; } 2>&1 | tee "$OUT/env.txt"
fi
if stage files; then  # the random full-size files (news5.py's), made once per machine before the
  # stages that need them: on a fresh machine this took 60 s or more inside the first such stage's
  # limit (thirteenth session: several stages printed nothing). FILES_FAMILIES: v2 and v4.1-mf
  timeout "${FILES_S:-300}" python3 - ${FILES_FAMILIES:-v2 v4.1-mf} <<'PY' 2>&1 | tee "$OUT/files.txt"
import sys, time
sys.path.insert(0, "benchmarks")
import news5
t0 = time.perf_counter()
news5.prepare_files(int4=True, families=set(sys.argv[1:]))
print(f"files for {sys.argv[1:]} ready in {time.perf_counter() - t0:.1f} s")
PY
fi
if stage tests; then
  # -v into pytest_full.txt: each test's name and outcome as it ends, kept if the stage runs out
  timeout "${TESTS_S:-150}" python3 -m pytest -v -p no:cacheprovider -o addopts="" $TESTS 2>&1 \
    | tee "$OUT/pytest_full.txt" | grep -v " PASSED" | tail -40 | tee "$OUT/pytest.txt"
fi
if stage profile; then
  timeout "${PROFILE_S:-200}" python3 benchmarks/profile_line.py ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.txt" | tail -80
fi
if stage codec; then
  timeout "${CODEC_S:-200}" python3 benchmarks/codec_speed.py ${CODEC_ARGS:-} 2>&1 | tee "$OUT/codec.txt" | tail -40
fi
if stage decode_batch; then  # stream windows of several lines in one batch vs one by one (graphs)
  timeout "${DECODE_BATCH_S:-120}" python3 benchmarks/decode_batch.py ${DECODE_BATCH_ARGS:-} 2>&1 | tee "$OUT/decode_batch.txt" | tail -12
fi
if stage roofline; then  # a window's decode op by op against the roofline; runs split by ';' in ROOF_RUNS
  i=0; IFS=';' read -ra runs <<< "${ROOF_RUNS:---rows 16}"
  for a in "${runs[@]}"; do i=$((i+1))
    timeout "${ROOF_S:-150}" python3 benchmarks/codec_roofline.py $a 2>&1 | tee "$OUT/roofline$i.txt" | tail -18
  done
fi
if stage text; then  # the v4 text backbone eager against fused, graphed (benchmarks/text_encoder.py)
  timeout "${TEXT_S:-200}" python3 benchmarks/text_encoder.py ${TEXT_ARGS:-} 2>&1 | tee "$OUT/text.txt" | tail -14
fi
if stage units; then  # the fused residual unit per width and packing (benchmarks/codec_units.py)
  timeout "${UNITS_S:-400}" python3 benchmarks/codec_units.py ${UNITS_ARGS:---thirds} 2>&1 | tee "$OUT/units.txt" | tail -40
fi
if stage concurrency; then  # many streams: batched vs serial side by side (benchmarks/concurrency.py)
  timeout "${CONC_S:-300}" python3 benchmarks/concurrency.py ${CONC_ARGS:---streams 1,4,16,64 --lines 3 --server 0 --stall-dump 60} --json "$OUT/concurrency.json" 2>&1 | tee "$OUT/concurrency.txt" | tail -20
fi
if stage concurrency2; then  # a second concurrency run with other arguments (e.g. the other mode)
  timeout "${CONC2_S:-200}" python3 benchmarks/concurrency.py ${CONC2_ARGS:---modes o --streams 1,16 --lines 2 --server 0 --stall-dump 60} --json "$OUT/concurrency2.json" 2>&1 | tee "$OUT/concurrency2.txt" | tail -20
fi
if stage concurrency_base && [ -d .device_base ]; then  # the older tree's concurrency, same machine (see news5_base)
  [ -d .device_base/tests/data ] || { mkdir -p .device_base/tests && cp -r tests/data .device_base/tests/; }
  timeout "${CONC_BASE_S:-200}" python3 .device_base/benchmarks/concurrency.py ${CONC_BASE_ARGS:---modes e --streams 1,16 --lines 2 --server 0} --json "$OUT/concurrency_base.json" 2>&1 | tee "$OUT/concurrency_base.txt" | tail -20
fi
if stage host_profile; then  # one stream's host time: its own work vs waiting for the GPU (cProfile)
  timeout "${HOST_S:-120}" python3 benchmarks/host_profile.py ${HOST_ARGS:-} 2>&1 | tee "$OUT/host_profile.txt" | head -60
fi
if stage cpu_preset; then  # the CPU preset on the host's cores (issue 17: RTF <= 0.3)
  CUDA_VISIBLE_DEVICES= timeout "${CPU_S:-240}" python3 benchmarks/cpu_preset.py ${CPU_ARGS:-} 2>&1 | tee "$OUT/cpu_preset.txt" | tail -40
fi
if stage news5; then
  timeout "${NEWS5_S:-250}" python3 benchmarks/news5.py ${NEWS5_ARGS:---cpu-sentences 1 --int4-impl scratch} 2>&1 | tee "$OUT/news5.txt" | tail -60
fi
if stage news5_batch; then  # news5 again with the preset's max_batch raised: what line batches' prewarm costs one stream
  mkdir -p "$OUT/batch"
  OUT="$OUT/batch" timeout "${NEWS5_S:-250}" python3 benchmarks/news5.py ${NEWS5_ARGS:---cpu-sentences 1 --int4-impl scratch} --max-batch "${NEWS5_MAX_BATCH:-16}" 2>&1 | tee "$OUT/news5_batch.txt" | tail -20
fi
if stage news5_base && [ -d .device_base ]; then
  mkdir -p "$OUT/base"  # its news5.json goes to base/
  [ -d .device_base/tests/data ] || { mkdir -p .device_base/tests && cp -r tests/data .device_base/tests/; }
  OUT="$OUT/base" timeout "${NEWS5_S:-250}" python3 .device_base/benchmarks/news5.py ${NEWS5_ARGS:---cpu-sentences 1 --int4-impl scratch} 2>&1 | tee "$OUT/news5_base.txt" | tail -20
fi
if stage server_load; then
  # 200 concurrent OpenAI requests on the full-size model (VOICEVOX's audio_query needs pyopenjtalk,
  # whose dictionaries are too large to carry); .whl must hold the serve wheels (see its header)
  timeout "${SERVER_LOAD_S:-300}" python3 benchmarks/server_load.py ${SERVER_LOAD_ARGS:---full int4} 2>&1 | tee "$OUT/server_load.txt" | tail -20
fi
if stage many_speakers; then  # 16 and 32 Speakers on one full-size model: holes in streamed lines (issue 27)
  timeout "${MANY_S:-200}" python3 benchmarks/many_speakers.py ${MANY_ARGS:---full o --speakers 16,32 --lines 3 --repeat 1} 2>&1 | tee "$OUT/many_speakers.txt" | tail -12
fi
if stage int4; then
  timeout "${INT4_S:-110}" python3 benchmarks/int4_gpu.py ${INT4_ARGS:---quick --graph} 2>&1 | tee "$OUT/int4.txt" | tail -45
fi
if stage memory_phases; then
  timeout "${PHASES_S:-200}" python3 benchmarks/memory_phases.py ${PHASES_ARGS:-} 2>&1 | tee "$OUT/memory_phases.txt" | tail -90
fi
if stage memory_budget; then  # what --max-gpu-memory allows and the peak it holds (issue 27)
  timeout "${BUDGET_S:-300}" python3 benchmarks/memory_budget.py ${BUDGET_ARGS:-} 2>&1 | tee "$OUT/memory_budget.txt" | tail -20
fi
if stage memory; then
  timeout "${MEMORY_S:-200}" python3 benchmarks/memory_gpu.py ${MEMORY_ARGS:-} 2>&1 | tee "$OUT/memory.txt" | tail -40
fi
if stage caches; then  # last: the int4 tune file and Triton's kernels for later fresh machines (see above)
  rm -rf /tmp/caches_out && mkdir -p /tmp/caches_out
  [ -d "$IRODORI_CACHE/kernels" ] && cp -r "$IRODORI_CACHE/kernels" /tmp/caches_out/
  [ -d "$TRITON_DIR" ] && cp -r "$TRITON_DIR" /tmp/caches_out/triton
  tar -czf /tmp/device_caches.tgz -C /tmp/caches_out .
  size=$(stat -c %s /tmp/device_caches.tgz)
  if [ "$size" -le $((15 * 1024 * 1024)) ]; then cp /tmp/device_caches.tgz "$OUT/"; echo "caches: $size bytes"
  else echo "caches: $size bytes, over the 15 MiB a file may come back; not saved"; fi
fi
