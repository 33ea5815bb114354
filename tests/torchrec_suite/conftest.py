# TorchRec's vendored test files are run by tests/test_torchrec_2d_suite.py; collected
# directly they would only skip (CUDA / NCCL cases), so pytest does not collect them.
collect_ignore = ["vendored"]
