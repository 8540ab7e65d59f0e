import pytest

from ds4agent.protocol.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    return Tokenizer.load()
