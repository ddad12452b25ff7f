def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run by script/gpu-check with -m gpu)")
    # PuLP 3 announces the API changes of its 4.0 on every variable it makes.
    config.addinivalue_line("filterwarnings", "ignore:.*PuLP 4.0:DeprecationWarning")
