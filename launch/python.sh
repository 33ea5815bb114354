# Sourced by the launchers (from the repository root): the interpreter they run. PYTHON wins;
# else the project's .venv (what `make install` / `make train` create), else python3. An
# interpreter without torch, TorchRec or sparse2d is one line naming the fix, not a traceback.
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON="$PWD/.venv/bin/python"; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("torch", "torchrec", "sparse2d")))' 2>/dev/null; then
  echo "sparse2d: launch: PYTHON=$PYTHON cannot import torch, torchrec and sparse2d: run 'make install' (it creates .venv, which the launchers then use) or set PYTHON to an interpreter that has them" >&2
  exit 1
fi
