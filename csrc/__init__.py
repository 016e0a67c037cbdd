"""Native kernels. Each op has a pure-torch reference in the library; loaded through one module."""
