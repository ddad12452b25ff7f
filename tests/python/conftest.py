def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run by script/gpu-check with -m gpu)")
