"""interfaces.py against its sources: dumpcap's machine-readable lists (`-D -M`, `-L -M`: the format of
dumpcap.c's print_machine_readable_interfaces / _if_capabilities and capture_ifinfo.h's interface_type,
written out here; one list as this host's dumpcap 4.0 printed it), and the kernel's state of each
interface against `ip -j link show` (iproute2 reads the same netlink flags: UP, LOWER_UP = carrier,
operstate), plus a /sys tree built in the test for what no host interface shows.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from diagd.actors.capture.interfaces import exists, kernel_state, parse_link_types, parse_list

# `dumpcap -D -M` on a test host (dumpcap 4.0.17): "<n>. <name>\t<vendor>\t<friendly>\t<type>\t<addresses>\t
# <loopback|network>\t<extcap>"
RECORDED_D_M = (
    "1. eth0\t\t\t0\t192.0.2.2,fd00::2,fe80::fc:ff:fe00:1\tnetwork\t\n"
    "2. any\t\t\t0\t\tnetwork\t\n"
    "3. lo\t\tLoopback\t0\t127.0.0.1,::1\tloopback\t\n"
    "4. ifb0\t\t\t0\t\tnetwork\t\n"
    "6. bluetooth-monitor\t\t\t4\t\tnetwork\t\n"
    "9. dbus-system\t\t\t0\t\tnetwork\t\n"
)

NONE = {"up": None, "running": None, "operstate": None}


def entry(name: str, description: str, kind: str, addresses: list[str], loopback: bool) -> dict[str, object]:
    return {"name": name, "description": description, "type": kind, "addresses": addresses, "loopback": loopback}


def test_a_recorded_interface_list() -> None:
    assert parse_list(RECORDED_D_M) == [
        entry("eth0", "", "wired", ["192.0.2.2", "fd00::2", "fe80::fc:ff:fe00:1"], False),
        entry("any", "", "wired", [], False),
        entry("lo", "Loopback", "wired", ["127.0.0.1", "::1"], True),
        entry("ifb0", "", "wired", [], False),
        entry("bluetooth-monitor", "", "bluetooth", [], False),
        entry("dbus-system", "", "wired", [], False),
    ]


def test_every_interface_type_of_capture_ifinfo_h() -> None:
    """interface_type: IF_WIRED 0, IF_AIRPCAP 1, IF_PIPE 2, IF_STDIN 3, IF_BLUETOOTH 4, IF_WIRELESS 5,
    IF_DIALUP 6, IF_USB 7, IF_EXTCAP 8, IF_VIRTUAL 9; another number is kept as it is, none is unknown."""
    names = ["wired", "airpcap", "pipe", "stdin", "bluetooth", "wireless", "dialup", "usb", "extcap", "virtual"]
    text = "".join(f"{n + 1}. if{n}\t\t\t{n}\t\tnetwork\t\n" for n in range(10))
    text += "11. if10\t\t\t12\t\tnetwork\t\n12. if11\t\t\t\t\tnetwork\t\n"
    assert [i["type"] for i in parse_list(text)] == [*names, "12", "unknown"]


def test_the_description_is_the_friendly_name_else_the_vendor_one() -> None:
    text = ("1. a\tVendor A. Inc. (x)\tFriendly. A\t0\t\tnetwork\t\n"
            "2. b\tVendor B\t\t5\t10.0.0.1\tnetwork\t\n"
            "3. c\t\t\t0\t\tloopback\t\n")
    assert [(i["name"], i["description"], i["type"], i["addresses"], i["loopback"]) for i in parse_list(text)] == [
        ("a", "Friendly. A", "wired", [], False), ("b", "Vendor B", "wireless", ["10.0.0.1"], False),
        ("c", "", "wired", [], True)]


def test_lines_that_are_no_interface_are_skipped_and_short_ones_padded() -> None:
    text = ("\n"
            "Capturing on 'eth0'\n"  # no "<n>. "
            "x. eth9\t\t\t0\t\tnetwork\t\n"  # no number
            "1.eth8\t\t\t0\t\tnetwork\t\n"  # no ". "
            ". eth7\t\t\t0\t\tnetwork\t\n"  # an empty number
            "7. tun0\n"  # the name only: the other columns empty
            "8. odd name.with-dots\t\t\t9\t\tnetwork\t\n")
    assert parse_list(text) == [entry("tun0", "", "unknown", [], False),
                                entry("odd name.with-dots", "", "virtual", [], False)]
    assert parse_list("") == []


def test_link_types_and_monitor_mode() -> None:
    """print_machine_readable_if_capabilities: "1"/"0" for monitor mode, then "<dlt>\\t<name>\\t<description>"."""
    recorded_lo = "0\n1\tEN10MB\tEthernet\n"  # `dumpcap -L -M -i lo` on the test host
    assert parse_link_types(recorded_lo) == (False, [{"dlt": 1, "name": "EN10MB", "description": "Ethernet"}])
    wifi = "1\n105\tIEEE802_11\t802.11\n127\tIEEE802_11_RADIO\t802.11 plus radiotap header\n"
    assert parse_link_types(wifi) == (True, [
        {"dlt": 105, "name": "IEEE802_11", "description": "802.11"},
        {"dlt": 127, "name": "IEEE802_11_RADIO", "description": "802.11 plus radiotap header"}])
    odd = " 1 \n-1\tNEG\n 12\tRAW\tRaw IP\tmore\nx\tBAD\tnot a number\nX5\tBAD\tx\n13\n\n147\tUSER0\t\n"
    assert parse_link_types(odd) == (True, [
        {"dlt": -1, "name": "NEG", "description": ""},
        {"dlt": 12, "name": "RAW", "description": "Raw IP"},
        {"dlt": 147, "name": "USER0", "description": ""}])
    assert parse_link_types("") == (False, [])
    assert parse_link_types("2\n1\tEN10MB\tEthernet\n")[0] is False  # only "1" means monitor mode
    assert parse_link_types("1\n") == (True, [])
    assert parse_link_types("1\tEN10MB\tEthernet\n") == (False, [])  # the first line is never a link type


# -- the kernel's state -------------------------------------------------------------------------------


def fake_sys(root: Path, name: str, **files: str) -> Path:
    (root / name).mkdir(parents=True)
    for key, value in files.items():
        (root / name / key).write_text(value)
    return root


@pytest.mark.parametrize(("files", "expected"), [
    ({"flags": "0x1003\n", "operstate": "up\n", "carrier": "1\n"}, {"up": True, "running": True, "operstate": "up"}),
    ({"flags": "0x1002\n", "operstate": "down\n", "carrier": "0\n"},
     {"up": False, "running": False, "operstate": "down"}),
    ({"flags": "0x9\n", "operstate": "unknown\n", "carrier": "1\n"},
     {"up": True, "running": True, "operstate": "unknown"}),
    # IFF_UP is bit 0 only: 0x2 (BROADCAST) and 0x1000 (MULTICAST) alone are down
    ({"flags": "0x1000\n", "operstate": "down\n"}, {"up": False, "running": False, "operstate": "down"}),
    ({"flags": "0xffff\n", "operstate": "dormant\n", "carrier": "0"},
     {"up": True, "running": False, "operstate": "dormant"}),
    ({"flags": "1003", "operstate": "up", "carrier": "1"}, {"up": True, "running": True, "operstate": "up"}),
    # carrier unreadable (EINVAL while down: here, absent): no link
    ({"flags": "0x1003", "operstate": "lowerlayerdown"}, {"up": True, "running": False, "operstate": "lowerlayerdown"}),
    ({"flags": "0x1003", "operstate": "up", "carrier": "2"}, {"up": True, "running": False, "operstate": "up"}),
    # flags or operstate unreadable or not hex: nothing known
    ({"operstate": "up", "carrier": "1"}, NONE),
    ({"flags": "0x1003", "carrier": "1"}, NONE),
    ({"flags": "up", "operstate": "up", "carrier": "1"}, NONE),
    ({"flags": "", "operstate": "up", "carrier": "1"}, NONE),
])
def test_kernel_state_from_a_sys_tree(tmp_path: Path, files: dict[str, str], expected: dict[str, object]) -> None:
    assert kernel_state("veth0", fake_sys(tmp_path, "veth0", **files)) == expected


def test_kernel_state_of_names_sys_does_not_list(tmp_path: Path) -> None:
    root = fake_sys(tmp_path / "net", "eth0", flags="0x1003", operstate="up", carrier="1")
    for folder in (tmp_path, root):  # what "net/..", "net/." and "net/" would reach
        (folder / "flags").write_text("0x1003")
        (folder / "operstate").write_text("up")
    (root / "eth1").write_text("a file, not an interface directory")
    for name in ("any", "nflog", "", ".", "..", "eth0/", "eth0/../eth0", "eth1"):
        assert kernel_state(name, root) == NONE, name
    assert kernel_state("eth0", root) == {"up": True, "running": True, "operstate": "up"}


def _ip_links() -> list[dict[str, object]]:
    ip = shutil.which("ip")
    if ip is None:
        pytest.skip("iproute2 (ip) is not installed")
    done = subprocess.run([ip, "-j", "link", "show"], capture_output=True, text=True, check=True)
    links: list[dict[str, object]] = json.loads(done.stdout)
    return links


def test_kernel_state_of_this_hosts_interfaces_is_what_ip_link_says() -> None:
    links = _ip_links()
    assert links
    for link in links:
        name, flags = str(link["ifname"]), link["flags"]
        assert isinstance(flags, list)
        state = kernel_state(name)
        assert state == {"up": "UP" in flags, "running": "LOWER_UP" in flags,
                         "operstate": str(link["operstate"]).lower()}, (name, flags)
        assert exists(name)


def test_exists_is_a_kernel_interface_by_its_whole_name() -> None:
    names = [str(link["ifname"]) for link in _ip_links()]
    assert "lo" in names and exists("lo")
    for name in ("any", "nflog", "no-such-if0", "lo/", "lo/..", "../net/lo", "", ".", ".."):
        assert not exists(name), name


def test_this_hosts_dumpcap_list_names_every_kernel_interface() -> None:
    """`dumpcap -D -M` parsed: every interface `ip link` shows is listed, loopback as ip's LOOPBACK flag says."""
    dumpcap = shutil.which("dumpcap")
    if dumpcap is None:
        pytest.skip("dumpcap is not installed")
    done = subprocess.run([dumpcap, "-D", "-M"], capture_output=True, text=True, timeout=60)
    found = {i["name"]: i for i in parse_list(done.stdout)}
    for link in _ip_links():
        name, flags = str(link["ifname"]), link["flags"]
        assert isinstance(flags, list)
        assert name in found, (name, done.stdout)
        assert found[name]["loopback"] is ("LOOPBACK" in flags)
