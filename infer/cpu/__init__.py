"""The CPU backend: the network in C (cpu_net.c, built by net.py) or NumPy (backend), conv layers by
Winograd (winograd)."""
