// The browser UI of quarry serve. It uses only the public API, like any other client.
import { render } from "preact";

import "uplot/dist/uPlot.min.css";
import "./styles.css";
import { start } from "./app";
import { App } from "./views/App";

render(<App />, document.getElementById("app")!);
void start();
