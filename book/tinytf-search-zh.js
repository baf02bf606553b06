// The Chinese book's search page in Chinese. Sphinx 8 asks for the result summary with two new messages
// (one page / N pages) that its zh_CN catalog does not translate yet (it still has the old "page(s)" one),
// so the status line under the results was English. Added to Sphinx's own catalog, after translations.js.
Documentation.addTranslations({
  messages: {
    // keyed by the singular message; Chinese has one plural form (plural_expr "0"), with the count in it
    "Search finished, found one page matching the search query.": ["搜索完成，找到 ${resultCount} 个匹配的页面。"],
  },
  plural_expr: "0",
  locale: "zh_Hans_CN",
});
