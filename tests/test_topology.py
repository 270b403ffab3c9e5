"""Topology loading: the explicit form, templates, the library, and one test per bad-input kind."""

from pathlib import Path

import networkx as nx
import pytest

from conduit.errors import TopologyError
from conduit.topology import TierKind, library_names, load_topology

GOOD = """\
name: tiny
devices:
  - {id: gpu0, kind: gpu, memory: 80 GiB, memory_bandwidth: 3.35 TB/s}
  - {id: gpu1, kind: gpu, memory: 80 GiB}
  - {id: cpu0, kind: cpu, cores: 8}
  - {id: dram0, kind: memory, capacity: 64 GiB, pinned_capacity: 16 GiB, bandwidth: 100 GB/s}
  - {id: nvme0, kind: nvme, capacity: 1 TB, read_bandwidth: 7 GB/s, write_bandwidth: 5 GB/s}
  - {id: nic0, kind: nic, bandwidth: 400 Gb/s}
  - {id: sw, kind: switch}
links:
  - {src: gpu0, dst: sw, bandwidth: 450 GB/s, latency: 1 us}
  - {src: gpu1, dst: sw, bandwidth: 450 GB/s, latency: 1 us}
  - {src: gpu0, dst: cpu0, bandwidth: 64 GB/s, latency: 1 us}
  - {src: gpu1, dst: cpu0, bandwidth: 64 GB/s, latency: 1 us}
  - {src: dram0, dst: cpu0, bandwidth: 100 GB/s, latency: 100 ns}
  - {src: nvme0, dst: cpu0, bandwidth: 16 GB/s, latency: 10 us}
  - {src: nic0, dst: cpu0, bandwidth: 64 GB/s, latency: 1 us}
"""


def write(tmp_path: Path, text: str, name: str = "topo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_explicit_form_loads(tmp_path):
    topo = load_topology(write(tmp_path, GOOD))
    assert topo.name == "tiny"
    assert isinstance(topo.graph, nx.Graph)
    assert topo.graph.edges["gpu0", "sw"]["bandwidth"] == 450e9
    assert topo.graph.edges["dram0", "cpu0"]["latency"] == pytest.approx(100e-9)
    assert topo.devices["nic0"].get("bandwidth") == 50e9
    assert topo.nodes == ["node0"]
    hbm = topo.tiers_of(TierKind.HBM)
    assert [t.capacity for t in hbm] == [80 * 2**30] * 2
    pinned, pageable = topo.tiers_of("pinned")[0], topo.tiers_of("pageable")[0]
    assert pinned.capacity == 16 * 2**30 and pageable.capacity == 48 * 2**30
    assert topo.tiers_of("nvme")[0].write_bandwidth == 5e9
    width, latency, hops = topo.widest_shortest_path("gpu0", "gpu1")
    assert hops == 2 and width == 450e9  # via the switch, not the slower CPU path
    assert latency == pytest.approx(2e-6)


def test_cluster_template_expands(tmp_path):
    write(tmp_path, GOOD, "tiny.yaml")
    cluster = write(tmp_path, """\
name: tiny-x4
cluster:
  nodes: [{type: tiny.yaml, count: 4}]
  fabric: {kind: fat-tree, leaves: 2, spines: 2, uplink: {bandwidth: 800 Gb/s, latency: 1 us}}
""", "cluster.yaml")
    topo = load_topology(cluster)
    assert topo.nodes == ["n0", "n1", "n2", "n3"]
    assert len(topo.devices_of("gpu")) == 8
    assert topo.graph.has_edge("n0.nic0", "fabric.leaf0") and topo.graph.has_edge("n3.nic0", "fabric.leaf1")
    assert topo.graph.edges["fabric.leaf0", "fabric.spine1"]["bandwidth"] == 100e9
    assert topo.graph.edges["n0.nic0", "fabric.leaf0"]["bandwidth"] == 50e9  # defaults to the NIC's speed
    summary = topo.summary()
    assert summary["inter_node_gpu_path"]["bottleneck_bandwidth"] == 50e9


def test_rail_optimized_fat_tree(tmp_path):
    node = """\
devices:
  - {id: gpu0, kind: gpu, memory: 1 GiB}
  - {id: gpu1, kind: gpu, memory: 1 GiB}
  - {id: nic0, kind: nic, bandwidth: 400 Gb/s}
  - {id: nic1, kind: nic, bandwidth: 400 Gb/s}
links:
  - {src: gpu0, dst: nic0, bandwidth: 64 GB/s, latency: 1 us}
  - {src: gpu1, dst: nic1, bandwidth: 64 GB/s, latency: 1 us}
  - {src: gpu0, dst: gpu1, bandwidth: 450 GB/s, latency: 1 us}
"""
    write(tmp_path, node, "n.yaml")
    topo = load_topology(write(tmp_path, """\
cluster:
  nodes: [{type: n.yaml, count: 4}]
  fabric: {kind: fat-tree, rail_optimized: true, leaves: 4, spines: 1, uplink: {bandwidth: 800 Gb/s}}
""", "c.yaml"))
    # 2 rails x 2 leaves per rail, 2 nodes per leaf: NIC r of node i -> leaf r*2 + i//2
    assert topo.graph.has_edge("n0.nic1", "fabric.leaf2")
    assert topo.graph.has_edge("n3.nic1", "fabric.leaf3")
    assert topo.graph.has_edge("n3.nic0", "fabric.leaf1")


def test_library_topologies_all_load():
    names = library_names()
    for expected in ("dgx-h100", "dgx-a100", "commodity-pcie", "dgx-h100-x2", "dgx-h100-x16",
                     "dgx-h100-x128", "hetero-mix"):
        assert expected in names
    for name in names:
        topo = load_topology(name)
        assert nx.is_connected(topo.graph), name
        assert topo.tiers, name


def test_x128_has_1024_gpus_and_the_fabric():
    topo = load_topology("dgx-h100-x128")
    assert len(topo.devices_of("gpu")) == 1024
    assert len(topo.nodes) == 128
    leaves = [d for d in topo.devices if d.startswith("fabric.leaf")]
    spines = [d for d in topo.devices if d.startswith("fabric.spine")]
    assert (len(leaves), len(spines)) == (32, 16)


def _bad(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    message = str(info.value)
    assert str(path) in message, message
    return message


LINK = "{src: a, dst: b, bandwidth: 1 GB/s, latency: 1 us}"
DEVS = "devices: [{id: a, kind: cpu}, {id: b, kind: cpu}]\n"


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("devices: [\n  {id: a, kind: cpu\nlinks: []\n", None, "YAML syntax error at line"),
        ("- just\n- a list\n", None, "top level must be a mapping"),
        ("", None, "got empty"),
        (f"links: [{LINK}]\n", "devices", "missing 'devices'"),
        (DEVS, "links", "missing 'links'"),
        ("devices: []\nlinks: []\n", "devices", "non-empty list"),
        ("devices: [{id: a, kind: cpu}, {id: a, kind: cpu}]\nlinks: []\n", "devices[1].id", "duplicate device id"),
        (DEVS + "links: [{src: a, dst: z, bandwidth: 1 GB/s, latency: 1 us}]\n", "links[0].dst", "unknown device 'z'"),
        (DEVS + "links: [{src: a, dst: a, bandwidth: 1 GB/s, latency: 1 us}]\n", "links[0]", "self-loop"),
        (DEVS + "links: [{src: a, dst: b, latency: 1 us}]\n", "links[0].bandwidth", "missing"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: 0, latency: 1 us}]\n", "links[0].bandwidth", "must be > 0"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: -5 GB/s, latency: 1 us}]\n", "links[0].bandwidth", "> 0"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: fast, latency: 1 us}]\n", "links[0].bandwidth", "cannot parse"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: 1 GB/s}]\n", "links[0].latency", "missing"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: 1 GB/s, latency: -1 us}]\n", "links[0].latency", ">= 0"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: 1 GB/s, latency: soon}]\n", "links[0].latency", "cannot parse"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: 1 GB/s, latency: 1 lightyear}]\n", "links[0].latency",
         "unknown unit"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: 80 GiB, latency: 1 us}]\n", "links[0].bandwidth",
         "expected bandwidth"),
        (DEVS + "links: [{src: a, dst: b, bandwidth: 1 GB/s, latency: 1 GB/s}]\n", "links[0].latency",
         "expected time"),
        (("devices: [{id: a, kind: cpu}, {id: b, kind: cpu}, {id: c, kind: cpu}]\n"
          f"links: [{LINK}]\n"), "links", "disconnected"),
        ("devices: [{id: a, kind: toaster}]\nlinks: []\n", "devices[0].kind", "must be one of"),
        ("devices: [{id: g, kind: gpu}]\nlinks: []\n", "devices[0].memory", "required for a gpu"),
        ("devices: [{id: g, kind: gpu, memory: 40 GB/s}]\nlinks: []\n", "devices[0].memory", "expected bytes"),
        (DEVS + f"links: [{LINK}, {LINK}]\n", "links[1]", "duplicate link"),
        (DEVS + "links: {a: b}\n", "links", "must be a list"),
        ("cluster: {nodes: [{type: nowhere-to-be-found, count: 2}], fabric: {kind: single-switch}}\n",
         "cluster.nodes[0].type", "not a file and not a library topology"),
        ("cluster: {nodes: [{type: dgx-h100, count: 0}]}\n", "cluster.nodes[0].count", "positive integer"),
        ("cluster: {nodes: [{type: dgx-h100, count: 2}], fabric: {kind: torus}}\n", "cluster.fabric.kind",
         "must be one of"),
    ],
)
def test_bad_input_names_file_and_field(tmp_path, text, field, fragment):
    message = _bad(tmp_path, text)
    assert fragment in message, message
    if field is not None:
        assert f": {field}:" in message, message


def test_bad_yaml_reports_line(tmp_path):
    message = _bad(tmp_path, "devices:\n  - {id: a, kind: cpu}\n  - [unclosed\nlinks: []\n")
    assert "line" in message


def test_field_error_reports_line(tmp_path):
    message = _bad(tmp_path, DEVS + "links:\n  - {src: a, dst: b, bandwidth: 0, latency: 1 us}\n")
    assert "(line 3)" in message


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(TopologyError, match="no such file"):
        load_topology(tmp_path / "absent.yaml")
    with pytest.raises(TopologyError, match="not a file and not a library topology"):
        load_topology("no-such-cluster")


def test_show_reports_each_kind_of_node_in_a_mixed_cluster():
    summary = load_topology("hetero-mix").summary()
    widths = sorted(p["bottleneck_bandwidth"] for p in summary["intra_node_gpu_paths"])
    assert widths == [25e9, 300e9, 450e9]  # RTX 4090 via the CPU, A100 and H100 over NVSwitch
    assert summary["intra_node_gpu_path"]["bottleneck_bandwidth"] == 25e9
