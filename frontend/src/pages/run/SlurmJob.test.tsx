// Issue 38: a Slurm run's page shows its job (id, partition, account, QOS, Slurm's priority,
// who cancelled it) as GraphQL's Run.slurm answers it; a run on another cluster shows nothing.
import { cleanup, render, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";

import { aRun } from "../../testing/runs";
import { SlurmJob } from "./SlurmJob";

afterEach(cleanup);

const JOB = {
  jobId: "12",
  submittedHere: true,
  jobName: "llama-sft",
  account: "nlp",
  user: "alice",
  partition: "gpu",
  qos: "normal",
  priority: 4294901759,
  cancelledBy: "root",
};

function readout(): Record<string, string> {
  const list = screen.getByLabelText("Slurm job");
  const terms = within(list).getAllByRole("term").map((t) => t.textContent ?? "");
  const values = within(list).getAllByRole("definition").map((d) => d.textContent ?? "");
  return Object.fromEntries(terms.map((t, i) => [t, values[i]]));
}

describe("a run's Slurm job", () => {
  it("shows the job's facts and who cancelled it", () => {
    render(<SlurmJob job={aRun({ cluster: "hpc", slurm: JOB }).slurm} />);
    expect(screen.getByRole("region", { name: "Slurm" })).toBeTruthy();
    expect(readout()).toEqual({
      "Slurm job": "12 submitted from Astraeus",
      Partition: "gpu",
      Account: "nlp",
      QOS: "normal",
      Priority: "4294901759 Slurm's own",
      User: "alice",
      "Cancelled by": "root",
    });
  });

  it("says an imported job's origin, a dash for what Slurm did not say, no canceller when none", () => {
    render(<SlurmJob job={{ ...JOB, submittedHere: false, qos: "", priority: null, cancelledBy: null }} />);
    const shown = readout();
    expect(shown["Slurm job"]).toBe("12 imported from Slurm");
    expect([shown.QOS, shown.Priority]).toEqual(["—", "— Slurm's own"]);
    expect("Cancelled by" in shown).toBe(false);
  });

  it("shows nothing for a run on another cluster", () => {
    const { container } = render(<SlurmJob job={aRun().slurm} />);
    expect(container.textContent).toBe("");
  });
});
