# /// script
# requires-python = ">=3.9"
# ///
"""Checks that a freshly trained models directory matches a shipped one: same models, same recipes,
validation MAPE within 0.01 points. Usage: compare-manifests.py SHIPPED/manifest.json NEW/manifest.json"""
import json
import sys

shipped, new = (json.load(open(p)) for p in sys.argv[1:3])
index = {json.dumps(m["key"], sort_keys=True): m for m in new["models"]}
problems = []
if shipped["dataset"]["fingerprint"] != new["dataset"]["fingerprint"]:
    problems.append(f"dataset fingerprint {shipped['dataset']['fingerprint']} != {new['dataset']['fingerprint']}")
if shipped.get("operators", []) != new.get("operators", []):
    problems.append(f"operators trained {shipped.get('operators', [])} != {new.get('operators', [])}")
for m in shipped["models"]:
    key = json.dumps(m["key"], sort_keys=True)
    other = index.pop(key, None)
    if other is None:
        problems.append(f"{key}: missing from the new training")
    elif other["recipe"] != m["recipe"] or abs(other["validation"]["mape_percent"] - m["validation"]["mape_percent"]) > 0.01:
        problems.append(f"{key}: {m['recipe']} {m['validation']['mape_percent']:.2f}% -> {other['recipe']} {other['validation']['mape_percent']:.2f}%")
problems += [f"{k}: new model not shipped" for k in index]
name = sys.argv[1]
if problems:
    print(f"{name}: differs from a fresh training:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"{name}: {len(shipped['models'])} models match a fresh training")
