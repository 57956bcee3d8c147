"""The gpuplan command line: a thin layer over the library."""
