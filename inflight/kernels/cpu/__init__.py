"""C kernels for the CPU, compiled per vector ISA at first use (build.py) and called through ctypes."""
