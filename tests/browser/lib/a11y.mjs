// Accessibility checks that run inside the page: labelled controls, named buttons, and
// WCAG 2 contrast ratios computed from the computed styles.

/** Controls (input, select, textarea) without a label or ARIA name, as descriptions. */
export async function unlabelledControls(page) {
  return page.evaluate(() => {
    const named = (el) => {
      if (el.getAttribute("aria-label")?.trim()) return true;
      const by = el.getAttribute("aria-labelledby");
      if (by && by.split(/\s+/).some((id) => document.getElementById(id)?.textContent.trim())) return true;
      return [...(el.labels || [])].some((label) => label.textContent.trim());
    };
    return [...document.querySelectorAll("input, select, textarea")]
      .filter((el) => el.type !== "hidden")
      .filter((el) => !named(el))
      .map((el) => el.outerHTML.slice(0, 120));
  });
}

/** How many controls the page has (so a check on zero controls cannot pass by accident). */
export async function controlCount(page) {
  return page.evaluate(() => document.querySelectorAll("input:not([type=hidden]), select, textarea").length);
}

/** Buttons (and elements acting as buttons) with no accessible name. */
export async function unnamedButtons(page) {
  return page.evaluate(() =>
    [...document.querySelectorAll("button, summary, [role=button]")]
      .filter((el) => !(el.getAttribute("aria-label")?.trim() || el.textContent.trim() || el.getAttribute("title")?.trim()))
      .map((el) => el.outerHTML.slice(0, 120)),
  );
}

/** Elements carrying `aria-selected` where their role does not support it (a button's
 * selected state then reaches no assistive technology). */
export async function misplacedAriaSelected(page) {
  return page.evaluate(() => {
    const supports = new Set(["gridcell", "option", "row", "tab", "columnheader", "rowheader", "treeitem"]);
    return [...document.querySelectorAll("[aria-selected]")]
      .filter((el) => !supports.has(el.getAttribute("role") || ""))
      .map((el) => el.outerHTML.slice(0, 120));
  });
}

/**
 * The contrast ratio of each visible element matching a selector: its text colour against
 * the background it sits on (its own, or the nearest ancestor's, semi-transparent layers
 * composited over the page's white canvas). With `pseudo` ("::placeholder"), the colour of
 * that pseudo-element. Returns [{selector, text, fg, bg, ratio, size, weight}].
 */
export async function contrasts(page, selectors, pseudo = null) {
  return page.evaluate(([selectors, pseudo]) => {
    const parse = (value) => {
      const m = value.match(/rgba?\(([^)]+)\)/);
      if (!m) return null;
      const parts = m[1].split(/[\s,/]+/).filter(Boolean).map(Number);
      return { r: parts[0], g: parts[1], b: parts[2], a: parts.length > 3 ? parts[3] : 1 };
    };
    const over = (top, bottom) => {
      const a = top.a + bottom.a * (1 - top.a);
      if (a === 0) return { r: 0, g: 0, b: 0, a: 0 };
      const mix = (t, b) => (t * top.a + b * bottom.a * (1 - top.a)) / a;
      return { r: mix(top.r, bottom.r), g: mix(top.g, bottom.g), b: mix(top.b, bottom.b), a };
    };
    const background = (el) => {
      const layers = [];
      for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
        const c = parse(getComputedStyle(node).backgroundColor);
        if (c && c.a > 0) {
          layers.push(c);
          if (c.a >= 1) break;
        }
      }
      let bg = { r: 255, g: 255, b: 255, a: 1 };
      for (const layer of layers.reverse()) bg = over(layer, bg);
      return bg;
    };
    const luminance = ({ r, g, b }) => {
      const lin = (v) => {
        v /= 255;
        return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
      };
      return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
    };
    const hex = ({ r, g, b }) => "#" + [r, g, b].map((v) => Math.round(v).toString(16).padStart(2, "0")).join("");
    const out = [];
    for (const selector of selectors) {
      for (const el of document.querySelectorAll(selector)) {
        const style = getComputedStyle(el);
        const box = el.getBoundingClientRect();
        const text = pseudo === "::placeholder" ? el.placeholder || "" : el.textContent;
        if (!text.trim() || box.width === 0 || box.height === 0 || style.visibility === "hidden") continue;
        const bg = background(el);
        const fg = over(parse(getComputedStyle(el, pseudo).color), bg);
        const [l1, l2] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
        out.push({
          selector: pseudo ? `${selector}${pseudo}` : selector,
          text: text.trim().replace(/\s+/g, " ").slice(0, 40),
          fg: hex(fg),
          bg: hex(bg),
          ratio: Math.round(((l1 + 0.05) / (l2 + 0.05)) * 100) / 100,
          size: style.fontSize,
          weight: style.fontWeight,
        });
        break; // one element per selector is enough: they share a style
      }
    }
    return out;
  }, [selectors, pseudo]);
}
