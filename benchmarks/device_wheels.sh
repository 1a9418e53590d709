#!/usr/bin/env bash
# The wheels gpu_run.sh's stages need that the device image lacks, downloaded into .whl/ at the
# versions this checkout's .venv holds (run after scripts/setup.sh; the device has no network, so
# they travel with the call: run(command="bash benchmarks/gpu_run.sh", carry=[".whl"])).
#
#   bash benchmarks/device_wheels.sh [base] [server] [--print]
#
# base (the default): soundfile, cffi, pycparser, soxr (audio/signal.py imports them, so every
# stage needs them) and pyloudnorm. server: what the server_load and many_speakers stages add
# (FastAPI and uvicorn with their needs the image lacks, websockets, py-spy for --gil-profile).
# --print: the name==version lines only, nothing downloaded. .whl/ is emptied first: two versions
# of one package stop the device's whole install. The platform tags are the device README's
# (cp312, manylinux x86_64); .gitignore keeps .whl/ out of commits.
set -euo pipefail
cd "$(dirname "$0")/.."
groups=() print=0
for a in "$@"; do
  case "$a" in
    base | server) groups+=("$a") ;;
    --print) print=1 ;;
    *) echo "device_wheels.sh: unknown argument '$a' (base, server, --print)" >&2; exit 2 ;;
  esac
done
[ ${#groups[@]} -eq 0 ] && groups=(base)
names=()
for g in "${groups[@]}"; do
  case "$g" in
    base) names+=(soundfile cffi pycparser soxr pyloudnorm) ;;
    server) names+=(fastapi starlette pydantic pydantic-core annotated-types annotated-doc
                    typing-inspection typing-extensions opentelemetry-api uvicorn websockets py-spy) ;;
  esac
done
py="${PYTHON:-.venv/bin/python}"
pins=$("$py" - "${names[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"not installed here: {' '.join(missing)} (run scripts/setup.sh first)")
PY
)
if [ "$print" = 1 ]; then echo "$pins"; exit 0; fi
rm -rf .whl && mkdir .whl
for pin in $pins; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$pin"
done
ls .whl
du -sh .whl
