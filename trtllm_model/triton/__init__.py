"""The Triton edge: the Python models tritonserver loads (model.py, the BLS, pre- and postprocessing models) and the
only code that touches Triton's request, response and tensor objects."""
