#!/usr/bin/env python3
"""Merges the rules of custom-rules.yaml (next to this script) into a prometheus-adapter
ConfigMap, keeping everything else: its metadata and labels, the resourceRules that serve
metrics.k8s.io, other rules. Idempotent: rules of the same metric name are replaced, not
added twice. Needs Python 3 with PyYAML.

  # kube-prometheus's pre-rendered manifests: merge into your copy, then apply that copy, so
  # that its next apply keeps the rules
  merge-rules.py manifests/prometheusAdapter-configMap.yaml
  # the live object (the next apply of kube-prometheus's own file overwrites it again)
  kubectl -n monitoring get configmap adapter-config -o yaml | merge-rules.py - | kubectl replace -f -

FILE is rewritten in place; "-" reads standard input and writes standard output. --key names
the data key holding the adapter's configuration (config.yaml, as in kube-prometheus and the
Helm chart)."""
import argparse
import os
import sys

import yaml

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "custom-rules.yaml")


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper, value):
    # Multi-line strings (queries, the configuration itself) as literal blocks, readable.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def dump(obj):
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100)


def merge(configmap, rules, key="config.yaml"):
    """The ConfigMap (a dict) with `rules` in its configuration's rules list."""
    if configmap.get("kind") != "ConfigMap" or key not in configmap.get("data", {}):
        raise ValueError(f"not a ConfigMap with data.{key}")
    config = yaml.safe_load(configmap["data"][key]) or {}
    names = {r["name"]["as"] for r in rules}
    kept = [r for r in config.get("rules") or []
            if (r.get("name") or {}).get("as") not in names]
    config["rules"] = kept + rules
    configmap["data"][key] = dump(config)
    return configmap


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help='a ConfigMap manifest, or "-" for stdin to stdout')
    parser.add_argument("--key", default="config.yaml")
    args = parser.parse_args()
    with open(RULES) as f:
        rules = yaml.safe_load(f)["rules"]
    text = sys.stdin.read() if args.file == "-" else open(args.file).read()
    out = dump(merge(yaml.safe_load(text), rules, args.key))
    if args.file == "-":
        sys.stdout.write(out)
    else:
        with open(args.file, "w") as f:
            f.write(out)


if __name__ == "__main__":
    main()
