"""Kernel variants the agents search over: templates (CUDA and CPU twins) under the launch contract."""
