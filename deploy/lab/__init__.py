"""The multi-datacenter lab: a topology run on one machine as if its datacenters were apart.

Every node (broker or controller) runs in its own network namespace, with an address in its
datacenter's subnet (10.B.<dc>.0/24) on that datacenter's bridge, which lives in the
datacenter's router namespace. Mirror workers run in the datacenter they copy into (as
MirrorMaker 2 recommends: consume remotely, produce locally), in a "mirror host" namespace
there. Between the routers lies the WAN, which delays every packet by the configured one-way
latency (default 30 ms, so 60 ms round trips):

- ``tc netem`` on each router's WAN veth where the kernel has netem;
- otherwise the user-space WAN: each router gets a TUN device with the routes to the other
  datacenters, and one process (`dcmirror lab wan`) reads every packet from them and writes
  it into the destination router's TUN device when it is due. Kernel routing and TCP are
  untouched: the packets are the real ones, only later.

A cut (`dcmirror lab cut DC [--from DC]`) replaces the routes between the routers with
blackhole routes, so packets between those datacenters are dropped silently as over a failed
link (``--reject``: refused with ICMP at once); traffic inside a datacenter and the root
namespace's own links to every router are not touched, so test clients keep reaching every
cluster. `heal` puts the routes back. Namespaces are named ``dcm-<pid of lab up>-...`` and the
root's links ``dcm<pid>h<n>``, so labs can run side by side and leftovers are recognisable;
`dcmirror lab down` removes everything a lab made (`--stale`: of labs that died).

Modules: plan (addresses, names, commands; sans-IO), wan (the delay line; sans-IO), tun (the
WAN process), network (runs commands, enters namespaces, cleans up), state (lab.json, the
registry of running labs), run (up/down/cut/heal/latency/status).
"""
