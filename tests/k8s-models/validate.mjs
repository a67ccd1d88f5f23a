// Validate Prometheus Operator objects (PrometheusRule, ServiceMonitor, PodMonitor) and KEDA
// ScaledObjects against the @kubernetes-models/prometheus-operator and @kubernetes-models/keda
// models, which carry the CRDs' OpenAPI schemas.
//
//   node validate.mjs rendered.yaml [more.yaml ...]
//
// Every YAML document in every file is read; documents of other kinds are counted as skipped.
// Prints one JSON report on stdout: {"checked": [{file, kind, name, valid, error}], "skipped": N}
// and exits 1 when any checked object is invalid, 2 on unreadable input.
import fs from 'node:fs';
import * as yaml from 'js-yaml';
import { PrometheusRule } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor';
import { PodMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor';
import { ScaledObject } from '@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject';

const MODELS = {
  'monitoring.coreos.com/v1/PrometheusRule': PrometheusRule,
  'monitoring.coreos.com/v1/ServiceMonitor': ServiceMonitor,
  'monitoring.coreos.com/v1/PodMonitor': PodMonitor,
  'keda.sh/v1alpha1/ScaledObject': ScaledObject,
};

const report = { checked: [], skipped: 0 };
for (const file of process.argv.slice(2)) {
  let docs;
  try {
    docs = yaml.loadAll(fs.readFileSync(file, 'utf8'));
  } catch (err) {
    console.error(`${file}: cannot read YAML: ${err.message}`);
    process.exit(2);
  }
  for (const doc of docs) {
    if (!doc || typeof doc !== 'object') continue;
    const Model = MODELS[`${doc.apiVersion}/${doc.kind}`];
    if (!Model) {
      report.skipped += 1;
      continue;
    }
    const entry = { file, kind: doc.kind, name: doc.metadata?.name ?? null, valid: true, error: null };
    try {
      new Model(doc).validate();
    } catch (err) {
      entry.valid = false;
      entry.error = String(err.message ?? err);
      process.exitCode = 1;
    }
    report.checked.push(entry);
  }
}
console.log(JSON.stringify(report));
