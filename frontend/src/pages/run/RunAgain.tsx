import { useState } from "react";

import { graphql } from "../../api";
import type { CreateRunMutation } from "../../generated/graphql";
import { specOf, type Run } from "./model";

const CREATE = /* GraphQL */ `mutation CreateRun($spec: JSON!) { createRun(spec: $spec) { run { name } errors { code field message } } }`;

// Run again: the specification as JSON under a new name, edited, then submitted.
export function RunAgain({ run, onClose, onCreated }: { run: Run; onClose: () => void; onCreated: (name: string) => void }) {
  const [text, setText] = useState(() => JSON.stringify({ ...specOf(run), name: `${run.name}-2` }, null, 2));
  const [errors, setErrors] = useState<string[]>([]);
  const submit = async () => {
    let spec: unknown;
    try {
      spec = JSON.parse(text);
    } catch (err) {
      setErrors([`The specification is not JSON: ${(err as Error).message}`]);
      return;
    }
    try {
      const { createRun } = await graphql<CreateRunMutation>(CREATE, { spec });
      if (createRun.errors.length) setErrors(createRun.errors.map((e) => `${e.field ?? "spec"}: ${e.message}`));
      else if (createRun.run) onCreated(createRun.run.name);
    } catch (err) {
      setErrors([(err as Error).message]);
    }
  };
  return (
    <section className="panel" role="dialog" aria-label="Run again">
      <h2>Run again</h2>
      <p className="muted">Its specification as JSON, under a new name: change what you need, then submit.</p>
      <textarea aria-label="Specification" value={text} onChange={(e) => setText(e.target.value)} rows={14} spellCheck={false} />
      {errors.length > 0 && (
        <ul className="error" role="alert">
          {errors.map((e) => (
            <li key={e}>{e}</li>
          ))}
        </ul>
      )}
      <div className="actions">
        <button type="button" onClick={submit}>
          Submit
        </button>
        <button type="button" onClick={onClose}>
          Cancel
        </button>
      </div>
    </section>
  );
}
