"""``python -m medproc``: the ``medproc`` command line (exits at once after flushing)."""

from .cli import run

if __name__ == "__main__":
    run()
