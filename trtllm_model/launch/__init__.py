"""The command line: `trtllm-triton` (cli.py), the model repository writer (configure.py) and the HTTP guard in front
of tritonserver."""
