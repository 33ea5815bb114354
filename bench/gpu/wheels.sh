#!/usr/bin/env bash
# Prepare what bench/gpu/check.sh installs on a GPU machine that has torch (2.11, cu130) but
# no TorchRec/FBGEMM and no network: FBGEMM 1.6.0 (the release for torch 2.11) with only
# sm_90 cubins, TorchRec 1.6.1, torchft 0.2.0 and the pure-Python packages from .venv.
# Writes .gpu/ (git-ignored): fb.part00 (carried by the first call), fb.part01 + the rest
# (carried by the second): one call may carry 64 MiB. Run from the repo root.
set -euo pipefail
W=${W:-/tmp/gpuw}; mkdir -p "$W/whl" .gpu
P="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $P -d "$W/whl" fbgemm-gpu==1.6.0 torchrec==1.6.1 torchft==0.2.0
rm -rf "$W/stage" && mkdir "$W/stage" && (cd "$W/stage" && unzip -q "$W"/whl/fbgemm_gpu-1.6.0-*.whl)
for so in "$W"/stage/fbgemm_gpu/*.so; do
  python3 bench/gpu/prune_fatbin.py "$so" 90 "$so.pruned" >/dev/null 2>&1 && mv "$so.pruned" "$so" || true
done
tar -C "$W/stage" -cf - . | xz -T2 -6 > "$W/fbgemm_sm90.tar.xz"
(cd .gpu && rm -f fb.part* && split -b 48M -d "$W/fbgemm_sm90.tar.xz" fb.part)
cp "$W"/whl/torchrec-*.whl "$W"/whl/torchft-*.whl .gpu/
SP=.venv/lib/python3.11/site-packages
# dist-info folders are globbed inside site-packages (tar -C does not glob)
tar -C $SP -czf .gpu/pure.tgz tensordict pyvers iopath torchmetrics opentelemetry \
  $(cd $SP && ls -d tensordict-*.dist-info pyvers-*.dist-info iopath-*.dist-info \
    torchmetrics-*.dist-info opentelemetry_*.dist-info googleapis_common_protos-*.dist-info) \
  google/api google/rpc google/type google/longrunning google/logging google/gapic google/cloud
ls -la .gpu
