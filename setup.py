from setuptools import Extension, setup

# One-pass statistics for the explorer (torchlens/web/_fused.c). Optional: where it cannot be
# compiled, the package installs without it and measures with torch's own reductions.
setup(
    ext_modules=[
        Extension("torchlens.web._fused", ["torchlens/web/_fused.c"], optional=True, extra_compile_args=["-O3"])
    ]
)
