#!/usr/bin/env node
// Checks Kubernetes objects against the Kubernetes OpenAPI schemas as packaged by
// kubernetes-models (core and apps APIs) and @kubernetes-models/prometheus-operator
// (ServiceMonitor, PrometheusRule), and against the CRD schemas vendored in crds/
// (<group>_<version>_<Kind>.json: the InferencePool of the inference gateway), which a small
// validator below checks (type, required, properties, additionalProperties, enum, bounds,
// lengths, patterns).
//
//   node deploy/validate/validate.mjs FILE.yaml...      # or "-" / no argument: stdin
//   kubectl kustomize deploy/kubernetes/overlays/gpu | node deploy/validate/validate.mjs
//
// Every document must be an object of a known apiVersion/kind. Besides the schema (types,
// required fields, enums, formats), the check is strict, as `kubectl apply
// --validate=strict` is: a field that the schema does not define is an error. The packaged
// validators do not reject unknown fields, so each object is validated through a Proxy that
// records which fields the validator looked at; in an object whose schema lists properties
// (the validator read some field of it and did not enumerate its keys, as it does for maps)
// every field it never looked at is unknown.
//
// Prints one line per object ("ok Deployment/dcformer-serve") and one per error; exits 1 if
// any object is invalid, 2 on unreadable input.
import { existsSync, readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

// apiVersion -> module prefix of its model classes.
function modulePath(apiVersion, kind) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`;
  }
  return `kubernetes-models/${apiVersion}/${kind}`;
}

async function modelClass(apiVersion, kind) {
  try {
    const mod = await import(modulePath(apiVersion, kind));
    return mod[kind] ?? null;
  } catch {
    return null;
  }
}

// The vendored CRD schema of apiVersion/kind, or null.
function crdSchema(apiVersion, kind) {
  const file = new URL(`./crds/${apiVersion.replace("/", "_")}_${kind}.json`, import.meta.url);
  return existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : null;
}

// Errors of `value` against an OpenAPI v3 (CRD structural) schema; strict: an object whose
// schema lists properties may hold no others.
function checkSchema(schema, value, path, out) {
  const where = path || "/";
  const type = Array.isArray(value) ? "array" : value === null ? "null" : typeof value;
  const want = schema.type;
  if (want === "integer" ? !Number.isInteger(value) : want === "number" ? type !== "number"
      : want !== undefined && want !== type) {
    out.push(`${where}: must be ${want}`);
    return;
  }
  if (schema.enum && !schema.enum.includes(value)) out.push(`${where}: must be one of ${schema.enum}`);
  if (type === "string") {
    if (schema.minLength !== undefined && value.length < schema.minLength) out.push(`${where}: too short`);
    if (schema.maxLength !== undefined && value.length > schema.maxLength) out.push(`${where}: too long`);
    if (schema.pattern && !new RegExp(schema.pattern).test(value)) out.push(`${where}: must match ${schema.pattern}`);
  }
  if (type === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) out.push(`${where}: must be >= ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) out.push(`${where}: must be <= ${schema.maximum}`);
  }
  if (type === "array") {
    if (schema.minItems !== undefined && value.length < schema.minItems) out.push(`${where}: too few items`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) out.push(`${where}: too many items`);
    if (schema.items) value.forEach((v, i) => checkSchema(schema.items, v, `${path}/${i}`, out));
  }
  if (type === "object") {
    for (const key of schema.required ?? []) {
      if (!(key in value)) out.push(`${path}/${key}: required`);
    }
    if (schema["x-kubernetes-preserve-unknown-fields"]) return;
    if (schema.maxProperties !== undefined && Object.keys(value).length > schema.maxProperties) {
      out.push(`${where}: too many properties`);
    }
    for (const [key, v] of Object.entries(value)) {
      const sub = schema.properties?.[key] ?? schema.additionalProperties;
      if (sub === undefined || sub === false) {
        if (schema.properties) out.push(`${path}/${key}: unknown field`);
      } else if (sub !== true) {
        checkSchema(sub, v, `${path}/${key}`, out);
      }
    }
  }
}

// Wraps `root` so that every read of a field is recorded per object.
function tracked(root) {
  const records = new Map();  // target object -> {read: Set, touched, enumerated}
  const proxies = new WeakMap();
  const wrap = (value) => {
    if (value === null || typeof value !== "object") return value;
    if (proxies.has(value)) return proxies.get(value);
    const rec = { read: new Set(), touched: false, enumerated: false };
    records.set(value, rec);
    const note = (key) => {
      if (typeof key !== "string") return;
      rec.touched = true;
      rec.read.add(key);
    };
    const proxy = new Proxy(value, {
      get(target, key, receiver) {
        note(key);
        return wrap(Reflect.get(target, key, receiver));
      },
      has(target, key) {
        note(key);
        return Reflect.has(target, key);
      },
      getOwnPropertyDescriptor(target, key) {
        note(key);
        return Reflect.getOwnPropertyDescriptor(target, key);
      },
      ownKeys(target) {
        rec.enumerated = true;
        return Reflect.ownKeys(target);
      },
    });
    proxies.set(value, proxy);
    return proxy;
  };
  return { proxy: wrap(root), records };
}

// Paths of the fields under `root` that the validator never looked at.
function unknownFields(root, records) {
  const out = [];
  const walk = (value, path) => {
    if (value === null || typeof value !== "object") return;
    if (Array.isArray(value)) {
      value.forEach((v, i) => walk(v, `${path}/${i}`));
      return;
    }
    const rec = records.get(value);
    for (const key of Object.keys(value)) {
      if (rec && rec.touched && !rec.enumerated && !rec.read.has(key)) {
        out.push(`${path}/${key}`);
      } else {
        walk(value[key], `${path}/${key}`);
      }
    }
  };
  walk(root, "");
  return out;
}

function describeErrors(err) {
  // runValidateFunc throws a ValidationError carrying ajv's errors.
  if (Array.isArray(err?.errors) && err.errors.length > 0) {
    return err.errors.map((e) => {
      const where = e.instancePath || "/";
      const extra = e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : "";
      return `${where}: ${e.message ?? e.keyword}${extra}`;
    });
  }
  return [String(err?.message ?? err)];
}

// Returns the error lines of one object (empty when valid).
export async function validateObject(obj) {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    return ["document is not an object"];
  }
  const { apiVersion, kind } = obj;
  if (typeof apiVersion !== "string" || typeof kind !== "string") {
    return ["apiVersion and kind are required"];
  }
  const crd = crdSchema(apiVersion, kind);
  if (crd !== null) {
    const out = [];
    checkSchema(crd, obj, "", out);
    return out;
  }
  const Cls = await modelClass(apiVersion, kind);
  if (Cls === null) return [`unknown apiVersion/kind ${apiVersion}/${kind}`];
  const { proxy, records } = tracked(obj);
  const errors = [];
  try {
    // The model's validate() runs the schema's validator on `this`: here, the tracked object.
    Cls.prototype.validate.call(proxy);
  } catch (err) {
    errors.push(...describeErrors(err));
  }
  for (const path of unknownFields(obj, records)) errors.push(`${path}: unknown field`);
  return errors;
}

async function main() {
  const files = process.argv.slice(2);
  const inputs = files.length === 0 ? ["-"] : files;
  let invalid = 0;
  let count = 0;
  for (const file of inputs) {
    let text;
    try {
      text = readFileSync(file === "-" ? 0 : file, "utf8");
    } catch (err) {
      console.error(`validate: cannot read ${file}: ${err.message}`);
      process.exit(2);
    }
    const docs = parseAllDocuments(text);
    for (const doc of docs) {
      if (doc.errors.length > 0) {
        console.error(`validate: ${file}: YAML error: ${doc.errors[0].message}`);
        process.exit(2);
      }
      const obj = doc.toJS();
      if (obj === null || obj === undefined) continue;  // empty document
      count += 1;
      const name = `${obj?.kind ?? "?"}/${obj?.metadata?.name ?? "?"}`;
      const errors = await validateObject(obj);
      if (errors.length === 0) {
        console.log(`ok ${name}`);
      } else {
        invalid += 1;
        for (const e of errors) console.log(`INVALID ${name} ${e}`);
      }
    }
  }
  console.log(`${count} object(s), ${invalid} invalid`);
  process.exit(invalid === 0 && count > 0 ? 0 : 1);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
