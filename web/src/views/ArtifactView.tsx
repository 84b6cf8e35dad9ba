// A file a step saved: PNG and SVG as images, interactive HTML in a sandboxed frame without
// same-origin access, CSV and Parquet as tables; each with a download link and its size.
import type { Artifact } from "../api";
import { size } from "../format";
import { TableView } from "./TableView";

export function ArtifactView({ artifact }: { artifact: Artifact }) {
  return (
    <figure class={`artifact artifact-${artifact.type}`}>
      {(artifact.type === "png" || artifact.type === "svg") && (
        <img src={artifact.url} alt={artifact.name} loading="lazy" />
      )}
      {artifact.type === "html" && (
        // Scripts may run (interactive charts), but as an opaque origin: no cookies, no API.
        <iframe src={artifact.url} sandbox="allow-scripts" title={artifact.name} loading="lazy" />
      )}
      {(artifact.type === "csv" || artifact.type === "parquet") && <TableView artifact={artifact} />}
      <figcaption>
        <a href={`${artifact.url}?download=1`} download={artifact.name.split("/").pop()}>
          {artifact.name}
        </a>{" "}
        <span class="size">{size(artifact.size_bytes)}</span>
        {artifact.type === "html" && (
          <>
            {" · "}
            <a href={artifact.url} target="_blank" rel="noopener noreferrer">
              open
            </a>
          </>
        )}
      </figcaption>
    </figure>
  );
}
