// The overview's charts: one uPlot chart per variant, its data read from the page's JSON block
// (no inline script: the Content-Security-Policy allows only the shipped files).
(function () {
  "use strict";
  var block = document.getElementById("chart-data");
  if (!block || typeof uPlot === "undefined") { return; }
  var data = JSON.parse(block.textContent);
  var releases = data.releases || [];

  function markers(u) {
    // A dashed vertical line, labelled, at the first bucket of each release.
    var ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#8250df";
    ctx.fillStyle = "#8250df";
    ctx.setLineDash([5, 4]);
    ctx.lineWidth = 1.5 * devicePixelRatio;
    ctx.font = (11 * devicePixelRatio) + "px sans-serif";
    releases.forEach(function (mark) {
      var x = Math.round(u.valToPos(mark[0], "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) { return; }
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillText(String(mark[1]), x + 4 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
    });
    ctx.restore();
  }

  function draw(element, s) {
    var width = Math.max(280, element.clientWidth || 600);
    var opts = {
      width: width,
      height: width < 500 ? 200 : 260,
      scales: {
        x: data.window ? { time: true, range: data.window } : { time: true },
        y: { range: [0, 1] }
      },
      series: [
        {},
        { label: "mean", stroke: "#0b5fff", width: 2, points: { show: true, size: 6 } },
        { label: "p10", stroke: "rgba(11,95,255,0.35)", width: 1, points: { show: false } },
        { label: "p90", stroke: "rgba(11,95,255,0.35)", width: 1, points: { show: false } }
      ],
      bands: [{ series: [3, 2], fill: "rgba(11,95,255,0.12)" }],
      axes: [{}, { label: "recall" }],
      hooks: { draw: [markers] }
    };
    var plot = new uPlot(opts, [s.x, s.mean, s.p10, s.p90], element);
    element.setAttribute("data-drawn", "true");
    return plot;
  }

  var plots = [];
  data.series.forEach(function (s) {
    var element = document.querySelector('.chart[data-metric="' + s.metric + '"]');
    if (element) { plots.push([element, draw(element, s)]); }
  });
  window.addEventListener("resize", function () {
    plots.forEach(function (pair) {
      var width = Math.max(280, pair[0].clientWidth || 600);
      pair[1].setSize({ width: width, height: width < 500 ? 200 : 260 });
    });
  });
})();
