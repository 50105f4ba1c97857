"""Build-time variant of the lab stand-in (VLLM_STANDIN_VARIANT=donor|old).

donor: current version, registry has Qwen3.5, requires transformers>=5.
old:   older version, no Qwen3.5 (neither the model file nor the registry entry),
       requires transformers<5,>=4.56.0 (what the field's old image pinned).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

VARIANTS = {
    "donor": ("0.33.0+lab.standin", ["transformers>=5"]),
    "old": ("0.11.0+lab.standin", ["transformers<5,>=4.56.0"]),
}
VARIANT = os.environ.get("VLLM_STANDIN_VARIANT", "donor")
if VARIANT not in VARIANTS:
    raise SystemExit("VLLM_STANDIN_VARIANT must be one of %s" % sorted(VARIANTS))
VERSION, REQUIRES = VARIANTS[VARIANT]


class BuildPy(build_py):
    """Record the variant in the package; leave the Qwen3.5 model file out of the old one."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if VARIANT == "old":
            modules = [m for m in modules if m[1] != "qwen3_5_moe"]
        return modules

    def run(self):
        super().run()
        path = os.path.join(self.build_lib, "vllm", "_lab_build.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("VARIANT = %r\nVERSION = %r\n" % (VARIANT, VERSION))


setup(version=VERSION, install_requires=REQUIRES, cmdclass={"build_py": BuildPy})
