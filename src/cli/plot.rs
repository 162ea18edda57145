//! `predict --plot`: an SVG of how each pipeline rank spends the step, one stacked bar per rank
//! (compute, TP / PP / DP communication, optimizer, bubble and waiting), or one bar of the
//! step's breakdown for the closed form — drawn by `chart`, as the HTML pages are.

use stepcast::predict::Prediction;

pub fn breakdown_svg(p: &Prediction, title: &str) -> String {
    super::chart::breakdown(p, title)
}
