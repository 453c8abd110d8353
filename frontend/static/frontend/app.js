/* Draws every <canvas data-chart="ID"> with Chart.js from the JSON in <script id="ID"> (json_script), on load
   and after htmx swaps; an existing chart on the canvas is replaced. No other behaviour lives here. */
(function () {
  "use strict";
  var COLORS = ["#1f5fa8", "#c2410c", "#0f766e", "#7c3aed", "#a16207"];

  function draw(root) {
    if (typeof Chart === "undefined") { return; }
    (root || document).querySelectorAll("canvas[data-chart]").forEach(function (canvas) {
      var source = document.getElementById(canvas.dataset.chart);
      if (!source) { return; }
      var spec = JSON.parse(source.textContent);
      var existing = Chart.getChart(canvas);
      if (existing) { existing.destroy(); }
      spec.datasets.forEach(function (dataset, i) {
        dataset.backgroundColor = COLORS[i % COLORS.length];
        dataset.borderColor = COLORS[i % COLORS.length];
      });
      new Chart(canvas, {
        type: spec.type,
        data: { labels: spec.labels, datasets: spec.datasets },
        options: { responsive: true, maintainAspectRatio: true, animation: false,
                   scales: { x: { title: { display: !!spec.x_title, text: spec.x_title || "" },
                                  ticks: { autoSkip: true, maxRotation: 60 } },
                             y: { beginAtZero: true, title: { display: !!spec.y_title, text: spec.y_title || "" } } },
                   plugins: { legend: { display: true } } }
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  document.addEventListener("htmx:afterSwap", function (event) { draw(event.target); });
})();
