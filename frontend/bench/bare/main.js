// The bundle-size baseline (bench/console.py): React and ReactDOM rendering one element,
// built by the same Vite.
import { createElement } from "react";
import { createRoot } from "react-dom/client";

createRoot(document.getElementById("root")).render(createElement("p", null, "Astraeus"));
