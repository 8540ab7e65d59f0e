"""The plain front end's terminal while a line is printed above its prompt: keys typed then reach
the prompt as typed (unechoed, Enter still Enter), on a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import select
import termios

from prompt_toolkit.input import create_input

from ds4agent.ui.plain import terminal_input


def _typed_during_a_print(make_input) -> tuple[bytes, bytes]:
    """(what the terminal echoed, what the program then reads) for "/list" + Enter typed while
    prompt_toolkit prints above the prompt (run_in_terminal's cooked_mode inside raw_mode)."""
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "r", closefd=False) as stdin:
            inp = make_input(stdin)
            with inp.raw_mode():
                with inp.cooked_mode():
                    os.write(master, b"/list\r")
                    echoed = os.read(master, 64) if select.select([master], [], [], 0.5)[0] else b""
                # back in the prompt: what it reads of the keys
                attrs = termios.tcgetattr(slave)
                attrs[6][termios.VMIN], attrs[6][termios.VTIME] = 0, 5  # a read returns what is queued
                termios.tcsetattr(slave, termios.TCSANOW, attrs)
                read = os.read(slave, 64)
        return echoed, read
    finally:
        os.close(master)
        os.close(slave)


def test_keys_typed_while_a_line_prints_are_not_echoed_and_keep_their_enter():
    echoed, read = _typed_during_a_print(terminal_input)
    assert echoed == b""
    assert read == b"/list\r"  # Enter (^M): the prompt sends the line


def test_prompt_toolkits_own_input_would_echo_them_and_turn_enter_into_ctrl_j():
    # What terminal_input changes: the stock input's print switches to cooked mode, where the
    # terminal echoes the keys and hands Enter over as ^J (the editor's new line, not a send).
    echoed, read = _typed_during_a_print(create_input)
    assert b"/list" in echoed
    assert read == b"/list\n"
