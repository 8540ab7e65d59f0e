from __future__ import annotations

import os

import pytest

from ds4agent.tools.sandbox_settings import SandboxSettingsError, job_environment, load_allowed_sockets


def test_the_allow_list_is_read_from_the_users_config_dir(tmp_path):
    assert load_allowed_sockets(tmp_path) == ()
    (tmp_path / "sandbox.json").write_text('{"allow_unix_sockets": ["/run/docker.sock", "~/agent.sock"]}')
    assert load_allowed_sockets(tmp_path) == (os.path.realpath("/run/docker.sock"),
                                              os.path.realpath(os.path.expanduser("~/agent.sock")))


@pytest.mark.parametrize("text", ["{", '{"allow_unix_sockets": "/run/docker.sock"}', '{"allow_unix_sockets": [""]}'])
def test_a_bad_settings_file_is_an_error_naming_it(tmp_path, text):
    (tmp_path / "sandbox.json").write_text(text)
    with pytest.raises(SandboxSettingsError, match="sandbox.json"):
        load_allowed_sockets(tmp_path)


def test_socket_variables_are_kept_only_for_allowed_sockets():
    env = {"TMUX": "/tmp/tmux-0/default,1,0", "DOCKER_HOST": "unix:///run/docker.sock", "HOME": "/root",
           "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus"}
    assert job_environment(env, ()) == {"HOME": "/root"}
    kept = job_environment(env, (os.path.realpath("/run/docker.sock"),))
    assert kept == {"HOME": "/root", "DOCKER_HOST": "unix:///run/docker.sock"}
