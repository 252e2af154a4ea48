"""Imported first by the scheduler golden scripts: re-executes the running script under
ATEN_CPU_CAPABILITY=avx2 (and without writing bytecode) before torch is imported, so that torch
uses the AVX2 kernels whatever this CPU would pick. Their FMA-contracted linspace gives the
alphas_cumprod our schedule reproduces bit for bit (make_diffusion_goldens.py)."""
import os
import sys

if os.environ.get("ATEN_CPU_CAPABILITY") is None:
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, ATEN_CPU_CAPABILITY="avx2", PYTHONDONTWRITEBYTECODE="1"))
