"""Stand-in for ansible-test's downloaded get-pip script (that host cannot be reached here).

ansible-test runs it inside each new sanity venv with pip arguments plus --no-setuptools
--no-wheel: bootstrap pip with the standard library's ensurepip, then pip-install the arguments.
"""

import os
import subprocess
import sys

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Set by scripts/sanity.sh to the wheels scripts/bootstrap.sh fetched: every pip run in the new venv
# installs from there and never asks the package index.
WHEELHOUSE = None


def main():
    args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ)
    # ensurepip hides the system pip configuration; ansible-test's trimmed environment drops PIP_CERT.
    env.pop("PIP_CONFIG_FILE", None)
    # The venv's own pip.conf holds for the requirement installs that ansible-test runs next.
    lines = ["[global]"]
    if os.path.exists(CA_BUNDLE):
        lines.append("cert = %s" % CA_BUNDLE)
    if WHEELHOUSE:
        lines += ["no-index = true", "find-links = %s" % WHEELHOUSE]
    with open(os.path.join(sys.prefix, "pip.conf"), "w", encoding="utf-8") as conf:
        conf.write("\n".join(lines) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args], check=True, env=env)


if __name__ == "__main__":
    main()
