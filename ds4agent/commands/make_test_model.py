"""`ds4agent make-test-model OUT.gguf [--config NAME] [--experts q2|q4|mxfp4] [--seed N]`."""

from __future__ import annotations

from ds4agent.engine.errors import EngineError
from ds4agent.testmodels import make_test_model

from .boundary import run_file_command
from .settings import MakeTestModelSettings


def main(settings: MakeTestModelSettings) -> int:
    experts = settings.experts

    def action() -> str:
        # A small config with quantised experts and no marker would be refused by the engine's
        # strict check: from the command line, the quantised layout is the Flash file's.
        # (mxfp4 experts in a small config keep the marker: writer.make_test_model.)
        if experts not in (None, "mxfp4") and settings.config != "flash":
            raise EngineError(f"--experts {experts} applies to --config flash (the Flash-shape test file); "
                              "--experts mxfp4 applies to every config")
        out = make_test_model(settings.out, config=settings.config, seed=settings.seed, experts=experts)
        flavour = f", {experts or 'q2'} experts" if settings.config == "flash" or experts else ""
        return (f"wrote {out} ({settings.config}{flavour}, seed {settings.seed}, "
                f"{out.stat().st_size / 1e6:.1f} MB)")

    return run_file_command(action, failure=f"cannot write {settings.out}")
