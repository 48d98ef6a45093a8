// Validates Prometheus-operator objects (PodMonitor, PrometheusRule, ...) against the operator's CRD schemas, as
// packaged in @kubernetes-models/prometheus-operator (installed by the Makefile into .venv/node).
//   node tests/kubernetes_crds.mjs MODELS_DIR < objects.json      (a JSON list of objects)
// Prints one line per object ("ok KIND NAME" or "invalid KIND NAME: why"); exits 1 if any is invalid.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modelsDir] = process.argv.slice(2);
const objects = JSON.parse(readFileSync(0, "utf8"));
let invalid = 0;
for (const object of objects) {
  const [group, version] = object.apiVersion.split("/");
  const file = join(modelsDir, "node_modules/@kubernetes-models/prometheus-operator", group, version, `${object.kind}.js`);
  const module = await import(pathToFileURL(file));
  try {
    new module[object.kind](object).validate();
    console.log(`ok ${object.kind} ${object.metadata.name}`);
  } catch (error) {
    invalid += 1;
    console.log(`invalid ${object.kind} ${object.metadata.name}: ${error.message}`);
  }
}
process.exit(invalid ? 1 : 0);
