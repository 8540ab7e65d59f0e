import pytest

from ds4agent.engine.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    return Tokenizer.load()
